/* libFuzzer target for the .evt parser and printer: any input must either fail cleanly with a message or
 * parse to a graph whose canonical print reads back to the same print (print(parse(print(g))) ==
 * print(g)) and that passes evt_graph_verify; anything else aborts. Build: make fuzz; run: build/fuzz_parse tests/fuzz/corpus */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  char *err = NULL;
  evt_graph *g = evt_parse(text, "fuzz.evt", &err);
  free(text);
  if (!g) {
    if (!err || !*err) abort(); /* a failure always comes with a message */
    free(err);
    return 0;
  }
  if (err) abort();
  /* every node passed its op's rule when added: the full re-check must agree */
  if (evt_graph_verify(g) != EVT_OK) {
    fprintf(stderr, "a parsed graph fails evt_graph_verify: %s\n", evt_graph_error(g));
    abort();
  }
  char *first = evt_graph_to_string(g);
  if (!first) abort();
  evt_graph *g2 = evt_parse(first, "fuzz-reprint.evt", &err);
  if (!g2) {
    fprintf(stderr, "canonical text does not parse: %s\n---\n%s---\n", err ? err : "?", first);
    abort();
  }
  char *second = evt_graph_to_string(g2);
  if (!second || strcmp(first, second) != 0) {
    fprintf(stderr, "print is not a fixed point:\n---\n%s---\n%s---\n", first, second ? second : "(null)");
    abort();
  }
  if (evt_graph_node_count(g) != evt_graph_node_count(g2)) abort();
  free(first);
  free(second);
  evt_graph_free(g);
  evt_graph_free(g2);
  return 0;
}
