/* cli_submit: the GenerateRequest of the command line, shared by `qevict submit` and `qevict
 * bench serve`: the prompt (text, a file, token ids, chat), max tokens, sampling, stop strings
 * and the KV cache options, parsed by one option callback and built into a request. */
#ifndef QE_CLI_SUBMIT_H
#define QE_CLI_SUBMIT_H

#include <stddef.h>
#include <stdint.h>

#include "cli_rpc.h"

#define SUB_MAX_STOP 16

/* The options as given (strings point into argv). */
typedef struct {
  const char *cmd; /* the command, for messages ("submit") */
  cli_client_opts_t cl;
  const char *prompt, *prompt_file, *ids, *system, *request_id;
  const uint32_t *id_vec; /* the prompt's ids as numbers (bench serve), instead of --ids' text */
  size_t n_id_vec;
  int chat, ignore_eos, detach;
  long n;
  char *stop[SUB_MAX_STOP];
  size_t n_stop;
  Qevict__V1__Sampling sampling;
  Qevict__V1__Budget budget;
  Qevict__V1__Policy policy;
  Qevict__V1__GraphKV gkv;
  int has_sampling, has_budget, has_policy;
} sub_args_t;

/* The request and the parts it points to (owned here, freed by cli_sub_req_free; it also
 * points into the sub_args_t it was built from, which must outlive it). */
typedef struct {
  Qevict__V1__GenerateRequest req;
  Qevict__V1__Prompt prompt;
  Qevict__V1__ChatMessages chat;
  Qevict__V1__ChatMessage msgs[2];
  Qevict__V1__ChatMessage *msgp[2];
  Qevict__V1__TokenIds tids;
  char *text; /* the prompt text (malloc'd) */
} sub_req_t;

/* Defaults (128 new tokens, the tenant's policy and budget); cmd names the command in
 * messages. */
void cli_sub_init(sub_args_t *a, const char *cmd);
/* cli_opt_fn over a sub_args_t: the client options, the prompt, -n, sampling, --stop,
 * --request-id, --chat, --ignore-eos, --detach and the KV cache options. */
int cli_sub_opt(void *ud, const char *f, const char *v);
/* Builds the GenerateRequest of a (one of prompt, prompt_file and ids set). 0, or an exit code
 * after a message (an unreadable or empty prompt, bad ids). */
int cli_sub_build(const sub_args_t *a, sub_req_t *r);
void cli_sub_req_free(sub_req_t *r);

#endif
