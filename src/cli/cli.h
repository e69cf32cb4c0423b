/* evtc subcommands register themselves: in src/cli/cmd_<name>.c write
 *
 *   EVTC_COMMAND(print, "FILE", "parse a .evt file and print it") {
 *     ... argc/argv hold the command's own arguments (argv[0] is the command name) ...
 *     return EVTC_EXIT_OK;
 *   }
 *
 * Exit codes: 0 ok, 1 user error (bad input, bad flags), 2 internal error. `evtc CMD --help` prints the
 * usage line and the help text (describe every flag there, one per line) without calling the command. */
#ifndef EVT_CLI_H
#define EVT_CLI_H
#include "ir/ir.h"

enum { EVTC_EXIT_OK = 0, EVTC_EXIT_USER = 1, EVTC_EXIT_INTERNAL = 2 };

typedef int (*evtc_command_fn)(int argc, char **argv);
void evtc_register(const char *name, const char *usage, const char *help, evtc_command_fn fn);

#define EVTC_COMMAND(name, usage, help)                                                        \
  static int evtc_cmd_##name(int argc, char **argv);                                           \
  __attribute__((constructor)) static void evtc_reg_##name(void) {                             \
    evtc_register(#name, usage, help, evtc_cmd_##name);                                        \
  }                                                                                            \
  static int evtc_cmd_##name(int argc, char **argv)

/* Exit code for a library status: user errors → 1, EVT_ERR_INTERNAL → 2. */
int evtc_exit_code(evt_status st);
/* `--dtype V` of compile / tune: bf16 or f16 (as an evt_dtype) into *out; false (message on stderr naming cmd) otherwise. */
bool evtc_parse_dtype16(const char *cmd, const char *v, int *out);
/* The value v of a numeric flag: a whole decimal number (no trailing text, no overflow), or a finite double, in
 * [lo, hi]; else false with "evtc CMD: FLAG takes ..., not 'V'" on stderr (a user error: exit 1). */
bool evtc_parse_long(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out);
bool evtc_parse_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* All of standard input, malloc'd and NUL-terminated; NULL when unreadable or when it holds a NUL byte. */
char *evtc_read_stdin(void);
#endif
