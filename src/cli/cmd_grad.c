/* `evtc grad FILE [--inputs]`: parses a forward graph with a loss, appends its backward
 * (evt_graph_build_joint) and prints the joint graph. Its outputs: the loss, then grad.<p> for every param
 * (and every floating input with --inputs). FILE "-" reads standard input. Bad input or a graph that cannot
 * be differentiated: the message on stderr, exit 1. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

EVTC_COMMAND(grad, "FILE [--inputs]",
             "parse FILE (- for stdin), append the backward of its loss, print the joint graph\n"
             "             --inputs: also differentiate with respect to every floating-point input") {
  const char *path = NULL;
  unsigned flags = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--inputs")) {
      flags |= EVT_GRAD_INPUTS;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "evtc grad: unknown flag '%s'\n", argv[i]);
      return EVTC_EXIT_USER;
    } else if (path) {
      fprintf(stderr, "evtc grad: more than one file ('%s' and '%s')\n", path, argv[i]);
      return EVTC_EXIT_USER;
    } else {
      path = argv[i];
    }
  }
  if (!path) {
    fprintf(stderr, "usage: evtc grad FILE [--inputs]\n");
    return EVTC_EXIT_USER;
  }
  char *err = NULL;
  evt_graph *g;
  if (!strcmp(path, "-")) {
    char *text = evtc_read_stdin();
    if (!text) {
      fprintf(stderr, "<stdin>: cannot read the input (or it holds a NUL byte)\n");
      return EVTC_EXIT_USER;
    }
    g = evt_parse(text, "<stdin>", &err);
    free(text);
  } else {
    g = evt_parse_file(path, &err);
  }
  if (!g) {
    fprintf(stderr, "%s\n", err ? err : "evtc grad: cannot parse the input");
    free(err);
    return EVTC_EXIT_USER;
  }
  evt_status st = evt_graph_build_joint(g, flags);
  if (st == EVT_OK) st = evt_graph_print(g, stdout);
  if (st != EVT_OK) fprintf(stderr, "%s\n", evt_graph_error(g));
  evt_graph_free(g);
  return evtc_exit_code(st);
}
