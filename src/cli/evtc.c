/* evtc: the command-line tool. */
#include "evt_impl.h"

#include <string.h>

static int usage(FILE *out) {
  fprintf(out, "usage: evtc COMMAND [ARGS]\n"
               "commands:\n"
               "  print FILE     parse and print the graph\n");
  return out == stdout ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return usage(stdout);
  fprintf(stderr, "evtc: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}
