/* evtc: the command-line tool. Subcommands live in src/cli/cmd_*.c and register themselves (cli.h). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name, *usage, *help;
  evtc_command_fn fn;
} command;
static command commands[64];
static int ncommands;

void evtc_register(const char *name, const char *usage, const char *help, evtc_command_fn fn) {
  if (ncommands == EVT_ARRAY_LEN(commands)) evt_fatal(__FILE__, __LINE__, "too many commands");
  commands[ncommands++] = (command){name, usage, help, fn};
}

int evtc_exit_code(evt_status st) {
  return st == EVT_OK ? EVTC_EXIT_OK : st == EVT_ERR_INTERNAL ? EVTC_EXIT_INTERNAL : EVTC_EXIT_USER;
}

bool evtc_parse_dtype16(const char *cmd, const char *v, int *out) {
  *out = (int)evt_dtype_from_name(v, strlen(v));
  if (*out == (int)EVT_BF16 || *out == (int)EVT_F16) return true;
  fprintf(stderr, "evtc %s: --dtype takes bf16 or f16, not '%s'\n", cmd, v);
  return false;
}

bool evtc_parse_long(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (!errno && end != v && !*end && x >= lo && x <= hi) {
    *out = x;
    return true;
  }
  fprintf(stderr, "evtc %s: %s takes a whole number in [%ld, %ld], not '%s'\n", cmd, flag, lo, hi, v);
  return false;
}

bool evtc_parse_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (!errno && end != v && !*end && isfinite(x) && x >= lo && x <= hi) {
    *out = x;
    return true;
  }
  fprintf(stderr, "evtc %s: %s takes a finite number in [%g, %g], not '%s'\n", cmd, flag, lo, hi, v);
  return false;
}

static int by_name(const void *a, const void *b) { return strcmp(((const command *)a)->name, ((const command *)b)->name); }

static int usage(FILE *out) {
  fprintf(out, "evt: a compiler for deep-learning training steps\n\n"
               "usage: evtc COMMAND [ARGS]    (evtc COMMAND --help for details)\n\ncommands:\n");
  for (int i = 0; i < ncommands; i++) { /* first line of each command's help */
    const char *h = commands[i].help, *nl = strchr(h, '\n');
    fprintf(out, "  %-10s %.*s\n", commands[i].name, nl ? (int)(nl - h) : (int)strlen(h), h);
  }
  fprintf(out, "\nexit codes: 0 ok, 1 user error, 2 internal error\n");
  return out == stdout ? EVTC_EXIT_OK : EVTC_EXIT_USER;
}

int main(int argc, char **argv) {
  qsort(commands, (size_t)ncommands, sizeof commands[0], by_name);
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) return usage(stdout);
  for (int i = 0; i < ncommands; i++) {
    if (strcmp(argv[1], commands[i].name)) continue;
    for (int a = 2; a < argc; a++)
      if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
        printf("usage: evtc %s %s\n\n%s\n", commands[i].name, commands[i].usage, commands[i].help);
        return EVTC_EXIT_OK;
      }
    return commands[i].fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "evtc: unknown command '%s'\n\n", argv[1]);
  return usage(stderr);
}

char *evtc_read_stdin(void) {
  size_t len;
  char *text = evt_read_stream(stdin, &len);
  if (text && strlen(text) != len) { /* the text format has no NUL bytes */
    free(text);
    return NULL;
  }
  return text;
}
