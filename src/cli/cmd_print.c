/* `evtc print FILE` prints a .evt file in canonical form; `evtc check FILE` parses and verifies it and says
 * "FILE: ok, N nodes". FILE "-" reads standard input. Bad input: the message on stderr, exit 1. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* Parses the file named by the command's one argument; NULL (message printed) on failure. */
static evt_graph *load(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: evtc %s FILE\n", argv[0]);
    return NULL;
  }
  char *err = NULL;
  evt_graph *g;
  if (!strcmp(argv[1], "-")) {
    char *text = evtc_read_stdin();
    if (!text) {
      fprintf(stderr, "<stdin>: cannot read the input (or it holds a NUL byte)\n");
      return NULL;
    }
    g = evt_parse(text, "<stdin>", &err);
    free(text);
  } else {
    g = evt_parse_file(argv[1], &err);
  }
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "parse failed");
    free(err);
  }
  return g;
}

EVTC_COMMAND(print, "FILE", "parse a .evt file (- for stdin) and print it in canonical form") {
  evt_graph *g = load(argc, argv);
  if (!g) return EVTC_EXIT_USER;
  evt_status st = evt_graph_print(g, stdout);
  evt_graph_free(g);
  if (fflush(stdout) != 0) st = EVT_ERR_IO;
  if (st != EVT_OK) fprintf(stderr, "evtc print: cannot write the output\n");
  return evtc_exit_code(st);
}

EVTC_COMMAND(check, "FILE", "parse a .evt file (- for stdin) and check every node; prints FILE: ok, N nodes") {
  evt_graph *g = load(argc, argv);
  if (!g) return EVTC_EXIT_USER;
  evt_status st = evt_graph_verify(g);
  if (st == EVT_OK) printf("%s: ok, %d nodes\n", argv[1], evt_graph_node_count(g));
  else fprintf(stderr, "%s\n", evt_graph_error(g));
  evt_graph_free(g);
  return evtc_exit_code(st);
}
