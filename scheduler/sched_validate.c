/* sched_validate: a GenerateRequest checked and resolved against the model and the tenant's
 * limits into a request (sreq_t): prompt tokens, sampling, stop strings, policy, budget. Every
 * refusal names the field. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered.h"
#include "qe_status.h"
#include "sched_internal.h"
#include "kv_gpu.h"
#include "sched_validate.h"

#define WP(x) QEVICT__WORKER__V1__POLICY__##x
#define PP(x) QEVICT__V1__POLICY__##x

/* (a budget the request did not give is its tenant's default: said so in the messages) */
#define WHOSE_DEFAULT " (the tenant's default_budget)"

static int bad(sval_err_t *e, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  e->status = status;
  return -1;
}

/* The bytes of text that hold more tokens than the context, at the least: no token covers more
 * text than its piece's bytes (a piece spells its text, or more: '▁' for ' ', <0xNN> for a byte).
 */
static size_t text_cap(const sched_t *s) { return ((size_t)s->hp.n_ctx_train + 2) * s->max_piece; }

/* A text past text_cap: encodes only its first text_cap bytes (cut at a character), on the event
 * loop a bounded time; refused when those alone are more tokens than the context holds. */
static int refuse_long_text(sched_t *s, const char *text, size_t len, int special,
                            const char *field, sval_err_t *e) {
  size_t cut = text_cap(s), n = 0;
  int32_t *ids = NULL;
  if (len <= cut) return 0;
  while (cut > 0 && ((unsigned char)text[cut] & 0xc0) == 0x80) cut--;
  int rc = tok_encode(s->tok, text, cut, 0, special, &ids, &n);
  free(ids);
  if (rc || n <= (size_t)s->hp.n_ctx_train + 1) return 0; /* (a failure: the whole text's say) */
  return bad(e, SVAL_INVALID, "%s: %zu bytes, more tokens than the context length (%d)", field, len,
             s->hp.n_ctx_train);
}

/* The prompt's tokens from text (field: prompt.text, or prompt.chat for its rendered messages). */
static int prompt_from_text(sched_t *s, const char *text, int special, const char *field, sreq_t *r,
                            sval_err_t *e) {
  size_t n = 0, len = strlen(text);
  if (!sched_utf8_valid(text, len)) return bad(e, SVAL_INVALID, "%s: not valid UTF-8", field);
  if (refuse_long_text(s, text, len, special, field, e)) return -1;
  if (tok_encode(s->tok, text, len, tok_add_bos(s->tok), special, &r->prompt, &n))
    return bad(e, SVAL_INVALID, "%s: %s", field, qe_errmsg());
  r->n_prompt = (int)n;
  return 0;
}

static int prompt_from_chat(sched_t *s, const Qevict__V1__ChatMessages *c, sreq_t *r,
                            sval_err_t *e) {
  if (!c || !c->n_messages) return bad(e, SVAL_INVALID, "prompt.chat: no messages");
  if (s->chat_kind == CHAT_NONE)
    return bad(e, SVAL_INVALID, "prompt.chat: the model has no chat template");
  if (c->n_messages > (size_t)s->hp.n_ctx_train) /* (each renders to a token or more: refused
                                                    before millions are rendered, the loop held) */
    return bad(e, SVAL_INVALID, "prompt.chat: %zu messages, more than the context length (%d)",
               c->n_messages, s->hp.n_ctx_train);
  chat_msg_t *m = calloc(c->n_messages, sizeof *m);
  if (!m) return bad(e, SVAL_INTERNAL, "out of memory");
  int rc = 0;
  for (size_t i = 0; i < c->n_messages && !rc; i++) {
    const char *role = c->messages[i]->role, *content = c->messages[i]->content;
    if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
      rc = bad(e, SVAL_INVALID,
               "prompt.chat.messages[%zu].role: '%.32s' (system, user or "
               "assistant)",
               i, role);
    else if (!sched_utf8_valid(content, strlen(content)))
      rc = bad(e, SVAL_INVALID, "prompt.chat.messages[%zu].content: not valid UTF-8", i);
    m[i] = (chat_msg_t){role, content};
  }
  char *text = NULL;
  if (!rc && chat_render(s->chat_kind, s->gguf, m, c->n_messages, 1, &text))
    rc = bad(e, SVAL_INVALID, "prompt.chat: %s", qe_errmsg());
  free(m);
  if (!rc) rc = prompt_from_text(s, text, 1, "prompt.chat", r, e);
  free(text);
  return rc;
}

static int prompt_from_ids(sched_t *s, const Qevict__V1__TokenIds *t, sreq_t *r, sval_err_t *e) {
  if (!t || !t->n_ids) return bad(e, SVAL_INVALID, "prompt.token_ids: empty");
  int V = tok_n_vocab(s->tok);
  r->prompt = malloc(sizeof(int32_t) * t->n_ids);
  if (!r->prompt) return bad(e, SVAL_INTERNAL, "out of memory");
  for (size_t i = 0; i < t->n_ids; i++) {
    if (t->ids[i] >= (uint32_t)V)
      return bad(e, SVAL_INVALID, "prompt.token_ids[%zu]: %u is not below the vocabulary size %d",
                 i, t->ids[i], V);
    r->prompt[i] = (int32_t)t->ids[i];
  }
  r->n_prompt = (int)t->n_ids;
  return 0;
}

static int check_prompt(sched_t *s, const Qevict__V1__GenerateRequest *g, sreq_t *r,
                        sval_err_t *e) {
  const Qevict__V1__Prompt *p = g->prompt;
  int rc;
  switch (p ? p->kind_case : 0) {
  case QEVICT__V1__PROMPT__KIND_TEXT:
    if (!*p->text) return bad(e, SVAL_INVALID, "prompt.text: empty");
    rc = prompt_from_text(s, p->text, 0, "prompt.text", r, e);
    break;
  case QEVICT__V1__PROMPT__KIND_CHAT:
    rc = prompt_from_chat(s, p->chat, r, e);
    break;
  case QEVICT__V1__PROMPT__KIND_TOKEN_IDS:
    rc = prompt_from_ids(s, p->token_ids, r, e);
    break;
  default:
    return bad(e, SVAL_INVALID, "prompt: empty (set text, chat or token_ids)");
  }
  if (!rc && r->n_prompt <= 0) return bad(e, SVAL_INVALID, "prompt: encodes to no tokens");
  return rc;
}

/* The field path of g's prompt (it was checked to be set). */
static const char *prompt_field(const Qevict__V1__GenerateRequest *g) {
  switch (g->prompt->kind_case) {
  case QEVICT__V1__PROMPT__KIND_CHAT:
    return "prompt.chat";
  case QEVICT__V1__PROMPT__KIND_TOKEN_IDS:
    return "prompt.token_ids";
  default:
    return "prompt.text";
  }
}

static int check_length(sched_t *s, const Qevict__V1__GenerateRequest *g, sreq_t *r,
                        sval_err_t *e) {
  long ctx = s->hp.n_ctx_train;
  if (g->max_tokens == 0) return bad(e, SVAL_INVALID, "max_tokens: must be > 0");
  if (r->n_prompt >= ctx) /* (it had been blamed on max_tokens) */
    return bad(e, SVAL_INVALID,
               "%s: %d tokens leave no room for one more in the context length (%ld)",
               prompt_field(g), r->n_prompt, ctx);
  if ((long)r->n_prompt + (long)g->max_tokens > ctx)
    return bad(e, SVAL_INVALID,
               "max_tokens: prompt (%d tokens) + max_tokens (%u) exceeds the context length (%ld)",
               r->n_prompt, g->max_tokens, ctx);
  r->max_tokens = (int)g->max_tokens;
  r->ignore_eos = g->ignore_eos;
  return 0;
}

static int check_sampling(const Qevict__V1__Sampling *sp, sreq_t *r, sval_err_t *e) {
  qevict__worker__v1__sampling__init(&r->sampling);
  if (!sp) return 0;
  if (!(sp->temperature >= 0 && sp->temperature <= 100))
    return bad(e, SVAL_INVALID, "sampling.temperature: must be in [0, 100]");
  if (!(sp->top_p >= 0 && sp->top_p <= 1))
    return bad(e, SVAL_INVALID, "sampling.top_p: must be in [0, 1]");
  r->sampling.temperature = sp->temperature;
  r->sampling.top_k = sp->top_k;
  r->sampling.top_p = sp->top_p;
  r->sampling.seed = sp->seed;
  return 0;
}

static int check_stop(const Qevict__V1__GenerateRequest *g, sreq_t *r, sval_err_t *e) {
  if (g->n_stop > SREQ_MAX_STOP)
    return bad(e, SVAL_INVALID, "stop: %zu strings (at most %d)", g->n_stop, SREQ_MAX_STOP);
  for (size_t i = 0; i < g->n_stop; i++) {
    size_t n = strlen(g->stop[i]);
    if (n == 0 || n > 256) return bad(e, SVAL_INVALID, "stop[%zu]: must be 1..256 bytes", i);
    if (!sched_utf8_valid(g->stop[i], n))
      return bad(e, SVAL_INVALID, "stop[%zu]: not valid UTF-8", i);
    if (!(r->stop[r->n_stop++] = strdup(g->stop[i]))) return bad(e, SVAL_INTERNAL, "out of memory");
  }
  return 0;
}

static int check_client_id(const char *id, sreq_t *r, sval_err_t *e) {
  size_t n = strlen(id);
  if (n > 128) return bad(e, SVAL_INVALID, "client_request_id: longer than 128 bytes");
  for (size_t i = 0; i < n; i++)
    if (id[i] < 0x21 || id[i] > 0x7e)
      return bad(e, SVAL_INVALID, "client_request_id: printable ASCII only, no blank");
  memcpy(r->client_id, id, n + 1);
  return 0;
}

/* The public Policy copied into the worker's (names and scorer kept in r). */
static void policy_copy(const Qevict__V1__Policy *p, sreq_t *r) {
  Qevict__Worker__V1__Policy *w = &r->wpolicy;
  snprintf(r->scorer, sizeof r->scorer, "%s", p->scorer);
  w->scorer = r->scorer;
  if (p->q_opt_case == PP(Q_OPT_Q)) w->q_opt_case = WP(Q_OPT_Q), w->q = p->q;
  if (p->window_opt_case == PP(WINDOW_OPT_WINDOW))
    w->window_opt_case = WP(WINDOW_OPT_WINDOW), w->window = p->window;
  if (p->bits_opt_case == PP(BITS_OPT_BITS))
    w->bits_opt_case = WP(BITS_OPT_BITS), w->bits = p->bits;
  if (p->sink_opt_case == PP(SINK_OPT_SINK))
    w->sink_opt_case = WP(SINK_OPT_SINK), w->sink = p->sink;
  if (p->local_opt_case == PP(LOCAL_OPT_LOCAL))
    w->local_opt_case = WP(LOCAL_OPT_LOCAL), w->local = p->local;
  if (!p->graphkv) return;
  const Qevict__V1__GraphKV *gk = p->graphkv;
  w->graphkv = 1;
  if (gk->k_opt_case == QEVICT__V1__GRAPH_KV__K_OPT_K)
    w->graphkv_k_opt_case = WP(GRAPHKV_K_OPT_GRAPHKV_K), w->graphkv_k = gk->k;
  if (gk->m_opt_case == QEVICT__V1__GRAPH_KV__M_OPT_M)
    w->graphkv_m_opt_case = WP(GRAPHKV_M_OPT_GRAPHKV_M), w->graphkv_m = gk->m;
  if (gk->t_opt_case == QEVICT__V1__GRAPH_KV__T_OPT_T)
    w->graphkv_t_opt_case = WP(GRAPHKV_T_OPT_GRAPHKV_T), w->graphkv_t = gk->t;
}

/* Tenant default "NAME" or "NAME:BUDGET" (a fraction with a '.', or bytes). */
static void tenant_default(const sched_tenant_t *t, char *name, size_t n, double *frac,
                           uint64_t *bytes) {
  snprintf(name, n, "%s", t->default_policy);
  char *at = strchr(name, ':');
  if (!at) return;
  *at++ = 0;
  if (strchr(at, '.'))
    *frac = strtod(at, NULL);
  else
    *bytes = strtoull(at, NULL, 10);
}

/* 1 when a worker group that ever registered runs on a GPU (Hello.device "cuda:N"): a request
 * may be dispatched there, so its policy must be one the GPU cache runs. (A scheduler's groups
 * run on one kind of device: their bytes per token are taken from the first.) */
static int gpu_groups(const sched_t *s) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (g->ever_up && !strncmp(g->rank[0].device, "cuda", 4)) return 1;
  return 0;
}

/* The limits of the GPU workers' tiered cache (kv_gpu_create_tiered; the worker's open hook
 * checks the same, daemon/wrk_cache.c) for policy d on every shard of the TP split. */
static int check_gpu_policy(const sched_t *s, const sreq_t *r, const kv_policy_desc_t *d, int tp,
                            sval_err_t *e) {
  for (int rank = 0; rank < tp; rank++) {
    model_shard_t sh;
    if (model_shard_of(&s->hp, rank, tp, &sh)) return bad(e, SVAL_INTERNAL, "bad TP split");
    if (kv_gpu_policy_check(&d->cfg, d->name, *r->scorer != '\0', s->hp.head_dim, sh.n_head,
                            sh.n_kv))
      return bad(e, SVAL_INVALID, "%s", qe_errmsg());
  }
  return 0;
}

/* Bytes of the whole request (all ranks) at the minimum budget and at FullKV of the tiered
 * cache for its capacity (the GPU cache's on GPU workers): the least whole budgets whose share
 * gives every rank of the model's TP split its own minimum and FullKV (model_kv_share: by KV
 * heads, so a rank of more heads than an even split needs more of the whole). */
static int policy_bounds(sched_t *s, const kv_policy_desc_t *d, long cap, int tp, int gpu,
                         size_t *min, size_t *full) {
  *min = *full = 0;
  for (int rank = 0; rank < tp; rank++) {
    model_shard_t sh;
    size_t a, b;
    if (model_shard_of(&s->hp, rank, tp, &sh)) return QE_EINVAL;
    kv_geom_t g = {s->hp.n_layer, sh.n_head, sh.n_kv, s->hp.head_dim, 1};
    int rc = 0;
    rc = gpu ? kv_gpu_bounds(&g, &d->cfg, cap, NULL, &a, &b)
             : kv_tiered_bounds(&g, &d->cfg, cap, &a, &b);
    if (rc) return rc;
    const size_t wa = (size_t)model_kv_whole(&s->hp, &sh, a),
                 wb = (size_t)model_kv_whole(&s->hp, &sh, b);
    *min = wa > *min ? wa : *min, *full = wb > *full ? wb : *full;
  }
  return 0;
}

/* A sink or local region longer than the model's context, refused as generate refuses them (a
 * region longer than the request holds only the request's tokens: kv_tiered_bounds, and
 * kv_gpu_bounds in the GPU's windows). */
static int check_regions(const Qevict__V1__Policy *p, long ctx, sval_err_t *e) {
  if (p && p->sink_opt_case == PP(SINK_OPT_SINK) && (long)p->sink > ctx)
    return bad(e, SVAL_INVALID, "policy.sink: %u tokens exceeds the model context (%ld)", p->sink,
               ctx);
  if (p && p->local_opt_case == PP(LOCAL_OPT_LOCAL) && (long)p->local > ctx)
    return bad(e, SVAL_INVALID, "policy.local: %u tokens exceeds the model context (%ld)", p->local,
               ctx);
  return 0;
}

/* The policy of r (the request's, else the tenant's default "NAME[:BUDGET]", whose budget goes
 * into *frac or *bytes), resolved and checked against the model and the workers' cache into d. */
static int resolve_policy(sched_t *s, const Qevict__V1__GenerateRequest *g, const sched_tenant_t *t,
                          sreq_t *r, kv_policy_desc_t *d, double *frac, uint64_t *bytes,
                          sval_err_t *e) {
  char name[96] = "";
  const Qevict__V1__Policy *p = g->policy;
  if (!p || !*p->name) tenant_default(t, name, sizeof name, frac, bytes);
  snprintf(r->policy_name, sizeof r->policy_name, "%s", p && *p->name ? p->name : name);
  qevict__worker__v1__policy__init(&r->wpolicy);
  if (p) policy_copy(p, r);
  r->wpolicy.name = r->policy_name;
  if (tr_policy_resolve(&r->wpolicy, s->hp.head_dim, d))
    return bad(e, SVAL_INVALID, "%s", qe_errmsg());
  snprintf(r->policy, sizeof r->policy, "%s%s", d->name, /* (as the CLI's reports name it) */
           d->cfg.graphkv && !strstr(d->name, "+graphkv") ? "+graphkv" : "");
  if (!d->full && check_regions(p, s->hp.n_ctx_train, e)) return -1;
  int tp = sched_groups_tp(s);
  if (gpu_groups(s) && !d->full && check_gpu_policy(s, r, d, tp, e)) return -1;
  return 0;
}

/* Policy full: the budget it asks for is its FullKV (r->ask), which a fraction below 1 or fewer
 * bytes cannot name. */
static int ask_full(const Qevict__V1__Budget *b, uint64_t bytes, const char *whose, sreq_t *r,
                    sval_err_t *e) {
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_FRACTION && b->fraction < 1)
    return bad(e, SVAL_INVALID,
               "budget.fraction: policy full keeps every token; a fraction below 1 needs a "
               "policy that evicts or quantizes (policy.name)");
  if (bytes && (int64_t)bytes < r->full_kv_bytes)
    return bad(e, SVAL_INVALID, "budget%s: policy full needs %lld bytes (prompt + max_tokens)",
               whose, (long long)r->full_kv_bytes);
  r->ask_full = 1, r->ask = (uint64_t)r->full_kv_bytes;
  return 0;
}

/* The budget r asks for before its tenant's limits (r->ask*, sreq_t): the request's bytes or
 * fraction (else the tenant's default ones in frac, bytes), at most what holding everything at
 * Full would cost, and the policy's minimum. */
static int resolve_ask(sched_t *s, const Qevict__V1__GenerateRequest *g, const kv_policy_desc_t *d,
                       double frac, uint64_t bytes, sreq_t *r, sval_err_t *e) {
  const Qevict__V1__Budget *b = g->budget;
  r->ask_default = !(b && b->kind_case) && (frac != 0 || bytes != 0);
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_FRACTION) {
    if (!(b->fraction > 0 && b->fraction <= 1))
      return bad(e, SVAL_INVALID, "budget.fraction: must be in (0, 1]");
    frac = b->fraction, bytes = 0;
  } else if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES) {
    if (!b->bytes) return bad(e, SVAL_INVALID, "budget.bytes: must be > 0");
    bytes = b->bytes, frac = 0, r->ask_bytes = bytes;
  }
  long cap = (long)r->n_prompt + r->max_tokens;
  r->full_kv_bytes = (int64_t)sched_groups_full_kv_bytes(s, cap);
  if (d->full) return ask_full(b, bytes, r->ask_default ? WHOSE_DEFAULT : "", r, e);
  size_t min, full;
  int tp = sched_groups_tp(s);
  if (policy_bounds(s, d, cap, tp, gpu_groups(s), &min, &full))
    return bad(e, SVAL_INVALID, "%s", qe_errmsg());
  uint64_t want = bytes                      ? bytes
                  : frac >= 1.0 || frac == 0 ? full
                                             : (uint64_t)(frac * (double)r->full_kv_bytes);
  r->ask = want > full ? full : want, r->ask_min = min;
  return 0;
}

int sval_clamp_budget(const sreq_t *r, const sched_tenant_t *t, int64_t *budget, sval_err_t *e) {
  const char *whose = r->ask_default ? WHOSE_DEFAULT : "";
  int64_t limit = t->max_request_budget_bytes ? t->max_request_budget_bytes : t->kv_quota_bytes;
  if (r->ask_bytes > (uint64_t)t->kv_quota_bytes) /* (unsigned: 2^63 and up too) */
    return bad(e, SVAL_EXHAUSTED, "budget.bytes: %llu exceeds the tenant's quota (%lld bytes)",
               (unsigned long long)r->ask_bytes, (long long)t->kv_quota_bytes);
  if (r->ask_full && r->full_kv_bytes > limit)
    return bad(e, SVAL_EXHAUSTED,
               "budget: FullKV of prompt + max_tokens is %lld bytes, above the tenant's limit "
               "(%lld bytes)",
               (long long)r->full_kv_bytes, (long long)limit);
  uint64_t want = r->ask > (uint64_t)limit ? (uint64_t)limit : r->ask;
  if (want < r->ask_min)
    return bad(e, SVAL_INVALID,
               "budget%s: %llu bytes is below policy %s's minimum for this request (%llu bytes: "
               "sink and local windows, policy.sink and policy.local)",
               whose, (unsigned long long)want, r->policy, (unsigned long long)r->ask_min);
  *budget = (int64_t)want;
  return 0;
}

int sval_request(sched_t *s, const char *tenant, const Qevict__V1__GenerateRequest *g, sreq_t *r,
                 sval_err_t *e) {
  sched_tenant_t t;
  if (sched_tenants_get(s->tenants, tenant, &t))
    return bad(e, SVAL_UNAUTHENTICATED, "tenant '%s' no longer exists", tenant);
  if (check_client_id(g->client_request_id, r, e) || check_prompt(s, g, r, e) ||
      check_length(s, g, r, e) || check_sampling(g->sampling, r, e) || check_stop(g, r, e))
    return -1;
  kv_policy_desc_t d;
  double frac = 0;
  uint64_t bytes = 0;
  if (resolve_policy(s, g, &t, r, &d, &frac, &bytes, e) || resolve_ask(s, g, &d, frac, bytes, r, e))
    return -1;
  return sval_clamp_budget(r, &t, &r->budget, e);
}
