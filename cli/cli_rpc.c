/* cli_rpc: a blocking gRPC client over the gRPC C core, the client commands' shared options
 * and argument loop, and value helpers (see cli_rpc.h). */
#include "cli_rpc.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "cli.h"
#include "kv_policy.h"
#include "qe_json.h"
#include "qe_pem.h"
#include "qe_status.h"
#include "qe_tls.h"
#include "qe_target.h"

struct cli_rpc {
  grpc_channel *ch;
  char *auth; /* "Bearer <key>", or NULL */
};

/* One call in flight: its queue, buffers and status (tags: 1 send batch, 2 status, 3 recv). */
typedef struct {
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_metadata md;
  int n_md;
  grpc_metadata_array initial, trailing;
  grpc_status_code status;
  grpc_slice details;
  grpc_byte_buffer *send, *recv;
  int cancelled; /* by SIGINT or the callback */
} rpc_call_t;

static volatile sig_atomic_t rpc_interrupted;

static void rpc_on_sigint(int sig) {
  (void)sig;
  rpc_interrupted = 1;
}

/* gRPC's own log lines would interleave with the command's output; the status says enough. */
static void rpc_quiet_log(gpr_log_func_args *args) { (void)args; }

static int key_is_printable(const char *k) {
  for (; *k; k++)
    if (*k < 0x20 || *k > 0x7e) return 0;
  return 1;
}

/* Plaintext, or TLS credentials from tls (NULL: plaintext). */
static grpc_channel_credentials *rpc_creds(const cli_rpc_tls_t *tls) {
  if (!tls) return grpc_insecure_credentials_create();
  grpc_ssl_pem_key_cert_pair kp = {tls->key_pem, tls->cert_pem};
  return grpc_ssl_credentials_create(tls->ca_pem, tls->cert_pem ? &kp : NULL, NULL, NULL);
}

int cli_rpc_connect(const char *target, const char *key, const cli_rpc_tls_t *tls,
                    cli_rpc_t **out) {
  *out = NULL;
  if (key && !key_is_printable(key))
    return qe_errf(QE_EINVAL, "the API key has characters other than printable ASCII");
  cli_rpc_t *c = calloc(1, sizeof *c);
  if (!c) return QE_ENOMEM;
  if (key && *key) {
    size_t n = strlen(key) + sizeof "Bearer ";
    if (!(c->auth = malloc(n))) goto fail_auth;
    snprintf(c->auth, n, "Bearer %s", key);
  }
  if (!getenv("GRPC_VERBOSITY")) gpr_set_log_function(rpc_quiet_log);
  grpc_init();
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = CLI_RPC_MAX_MSG}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = CLI_RPC_MAX_MSG}},
      {GRPC_ARG_STRING,
       GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
       {.string = tls ? (char *)tls->server_name : NULL}},
  };
  grpc_channel_args ca = {tls && tls->server_name ? 3 : 2, args};
  grpc_channel_credentials *cr = rpc_creds(tls);
  c->ch = cr ? grpc_channel_create(target, cr, &ca) : NULL;
  if (cr) grpc_channel_credentials_release(cr);
  if (!c->ch) goto fail_channel;
  *out = c;
  return 0;

fail_channel:
  grpc_shutdown();
  free(c->auth);
fail_auth:
  free(c);
  return qe_errf(QE_ENOMEM, "cannot create a channel to '%s'", target);
}

void cli_rpc_close(cli_rpc_t *c) {
  if (!c) return;
  grpc_channel_destroy(c->ch);
  grpc_shutdown();
  free(c->auth);
  free(c);
}

static gpr_timespec rpc_deadline(double timeout_s) {
  if (timeout_s <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros((int64_t)(timeout_s * 1e6), GPR_TIMESPAN));
}

/* Creates the call, its queue and the request buffer. */
static int rpc_call_open(cli_rpc_t *c, const char *method, const void *req, size_t len,
                         double timeout_s, rpc_call_t *r) {
  memset(r, 0, sizeof *r);
  grpc_metadata_array_init(&r->initial);
  grpc_metadata_array_init(&r->trailing);
  r->details = grpc_empty_slice();
  r->status = GRPC_STATUS_UNKNOWN;
  if (!(r->cq = grpc_completion_queue_create_for_next(NULL))) return QE_ENOMEM;
  grpc_slice m = grpc_slice_from_copied_string(method);
  r->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, m, NULL,
                                     rpc_deadline(timeout_s), NULL);
  grpc_slice_unref(m);
  if (!r->call) return qe_errf(QE_ENOMEM, "cannot create a call to %s", method);
  grpc_slice body = grpc_slice_from_copied_buffer(req, len);
  r->send = grpc_raw_byte_buffer_create(&body, 1);
  grpc_slice_unref(body);
  if (c->auth) {
    r->md.key = grpc_slice_from_static_string("authorization");
    r->md.value = grpc_slice_from_copied_string(c->auth);
    r->n_md = 1;
  }
  return 0;
}

/* Drains and frees everything of the call (every started batch has completed). */
static void rpc_call_close(rpc_call_t *r) {
  if (r->call) grpc_call_unref(r->call);
  if (r->cq) {
    grpc_completion_queue_shutdown(r->cq);
    while (grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(r->cq);
  }
  if (r->n_md) grpc_slice_unref(r->md.value);
  if (r->send) grpc_byte_buffer_destroy(r->send);
  if (r->recv) grpc_byte_buffer_destroy(r->recv);
  grpc_metadata_array_destroy(&r->initial);
  grpc_metadata_array_destroy(&r->trailing);
  grpc_slice_unref(r->details);
}

/* Starts the batch that sends the request (and, unary, receives the only message). */
static int rpc_start_send(rpc_call_t *r, int with_recv) {
  grpc_op ops[5];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = (size_t)r->n_md;
  ops[0].data.send_initial_metadata.metadata = r->n_md ? &r->md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = r->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &r->recv;
  grpc_call_error e = grpc_call_start_batch(r->call, ops, with_recv ? 5 : 4, (void *)1, NULL);
  return e == GRPC_CALL_OK ? 0 : qe_errf(QE_EINVAL, "cannot start the call (gRPC error %d)", e);
}

static int rpc_start_status(rpc_call_t *r) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &r->trailing;
  op.data.recv_status_on_client.status = &r->status;
  op.data.recv_status_on_client.status_details = &r->details;
  grpc_call_error e = grpc_call_start_batch(r->call, &op, 1, (void *)2, NULL);
  return e == GRPC_CALL_OK ? 0 : qe_errf(QE_EINVAL, "cannot start the call (gRPC error %d)", e);
}

static int rpc_start_recv(rpc_call_t *r) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &r->recv;
  return grpc_call_start_batch(r->call, &op, 1, (void *)3, NULL) == GRPC_CALL_OK ? 0 : -1;
}

/* The next completed tag; polls every 100 ms so that a SIGINT cancels the call. The signal is
 * looked at before every wait: a stream whose events kept coming had never timed out, so its
 * call was not cancelled until it ended (a Ctrl-C'd submit let its request run to the end). */
static intptr_t rpc_next(rpc_call_t *r) {
  for (;;) {
    if (rpc_interrupted && !r->cancelled) {
      grpc_call_cancel(r->call, NULL);
      r->cancelled = 1;
    }
    gpr_timespec t =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(r->cq, t, NULL);
    if (ev.type == GRPC_OP_COMPLETE) return (intptr_t)ev.tag;
  }
}

static void rpc_fill_status(const rpc_call_t *r, cli_rpc_status_t *st) {
  st->code = (int)r->status;
  size_t n = GRPC_SLICE_LENGTH(r->details);
  if (n >= sizeof st->message) n = sizeof st->message - 1;
  memcpy(st->message, GRPC_SLICE_START_PTR(r->details), n);
  st->message[n] = '\0';
}

/* The payload of a received message as one slice (caller unrefs). */
static grpc_slice rpc_take_recv(rpc_call_t *r) {
  grpc_byte_buffer_reader rd;
  grpc_slice s = grpc_empty_slice();
  if (grpc_byte_buffer_reader_init(&rd, r->recv)) {
    s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
  }
  grpc_byte_buffer_destroy(r->recv);
  r->recv = NULL;
  return s;
}

/* SIGINT sets rpc_interrupted while calls are in flight (no SA_RESTART): the first call to
 * begin installs the handler, the last to end restores the previous one (calls may run in
 * several threads at once; an interrupt cancels them all). */
static pthread_mutex_t rpc_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static int rpc_sig_calls;
static struct sigaction rpc_sig_old;

static void rpc_sigint_begin(void) {
  pthread_mutex_lock(&rpc_sig_mu);
  if (!rpc_sig_calls++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = rpc_on_sigint;
    sigemptyset(&sa.sa_mask);
    rpc_interrupted = 0;
    sigaction(SIGINT, &sa, &rpc_sig_old);
  }
  pthread_mutex_unlock(&rpc_sig_mu);
}

static int rpc_sigint_end(void) {
  int hit = rpc_interrupted;
  pthread_mutex_lock(&rpc_sig_mu);
  if (!--rpc_sig_calls) sigaction(SIGINT, &rpc_sig_old, NULL);
  pthread_mutex_unlock(&rpc_sig_mu);
  return hit;
}

void cli_rpc_sigint_hold(void) { rpc_sigint_begin(); }
int cli_rpc_sigint_release(void) { return rpc_sigint_end(); }
int cli_rpc_interrupted(void) { return rpc_interrupted; }

/* The return code of a finished call. */
static int rpc_result(const rpc_call_t *r, int interrupted, cli_rpc_status_t *st) {
  rpc_fill_status(r, st);
  if (interrupted) return QE_ECANCELED;
  return st->code == GRPC_STATUS_OK ? 0 : QE_ECOMM;
}

int cli_rpc_unary(cli_rpc_t *c, const char *method, const void *req, size_t req_len,
                  double timeout_s, uint8_t **resp, size_t *resp_len, cli_rpc_status_t *st) {
  rpc_call_t r;
  *resp = NULL, *resp_len = 0;
  *st = (cli_rpc_status_t){GRPC_STATUS_UNKNOWN, ""};
  int rc = rpc_call_open(c, method, req, req_len, timeout_s, &r), pending = 0;
  rpc_sigint_begin();
  if (!rc && !(rc = rpc_start_send(&r, 1))) pending++;
  if (!rc && !(rc = rpc_start_status(&r))) pending++;
  for (; pending > 0; pending--) rpc_next(&r);
  int interrupted = rpc_sigint_end();
  if (!rc) rc = rpc_result(&r, interrupted, st);
  if (!rc && !r.recv) rc = qe_errf(QE_EFORMAT, "%s answered OK without a response", method);
  if (!rc) {
    grpc_slice s = rpc_take_recv(&r);
    *resp_len = GRPC_SLICE_LENGTH(s);
    if ((*resp = malloc(*resp_len ? *resp_len : 1)))
      memcpy(*resp, GRPC_SLICE_START_PTR(s), *resp_len);
    else
      rc = QE_ENOMEM;
    grpc_slice_unref(s);
  }
  rpc_call_close(&r);
  return rc;
}

/* Hands one received message to fn; a non-zero return cancels the call. */
static int rpc_deliver(rpc_call_t *r, cli_rpc_msg_fn fn, void *ud) {
  grpc_slice s = rpc_take_recv(r);
  int rc = fn(ud, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
  grpc_slice_unref(s);
  if (rc && !r->cancelled) {
    grpc_call_cancel(r->call, NULL);
    r->cancelled = 1;
  }
  return rc;
}

int cli_rpc_stream(cli_rpc_t *c, const char *method, const void *req, size_t req_len,
                   double timeout_s, cli_rpc_msg_fn fn, void *ud, cli_rpc_status_t *st) {
  rpc_call_t r;
  *st = (cli_rpc_status_t){GRPC_STATUS_UNKNOWN, ""};
  int rc = rpc_call_open(c, method, req, req_len, timeout_s, &r), pending = 0, fn_rc = 0;
  rpc_sigint_begin();
  if (!rc && !(rc = rpc_start_send(&r, 0))) pending++;
  if (!rc && !(rc = rpc_start_status(&r))) pending++;
  if (!rc && !rpc_start_recv(&r)) pending++;
  for (; pending > 0; pending--) {
    if (rpc_next(&r) != 3 || !r.recv) continue; /* a batch done, or the end of the stream */
    if (r.cancelled) { /* (a message that came in with the cancel: not shown) */
      grpc_byte_buffer_destroy(r.recv), r.recv = NULL;
      continue;
    }
    if (!fn_rc) fn_rc = rpc_deliver(&r, fn, ud);
    if (!fn_rc && !rpc_start_recv(&r)) pending++;
  }
  int interrupted = rpc_sigint_end();
  if (!rc) rc = rpc_result(&r, interrupted && !fn_rc, st);
  if (fn_rc) rc = fn_rc;
  rpc_call_close(&r);
  return rc;
}

int cli_rpc_call(cli_rpc_t *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                 ProtobufCMessage **resp, cli_rpc_status_t *st) {
  size_t n = protobuf_c_message_get_packed_size(req), out_len = 0;
  uint8_t *buf = malloc(n ? n : 1), *out = NULL;
  *resp = NULL;
  *st = (cli_rpc_status_t){GRPC_STATUS_UNKNOWN, ""};
  if (!buf) return QE_ENOMEM;
  protobuf_c_message_pack(req, buf);
  int rc = cli_rpc_unary(c, method, buf, n, timeout_s, &out, &out_len, st);
  if (!rc && !(*resp = protobuf_c_message_unpack(resp_desc, NULL, out_len, out)))
    rc = qe_errf(QE_EFORMAT, "the server's %s does not decode", resp_desc->name);
  free(out);
  free(buf);
  return rc;
}

/* ---- JSON of protobuf-c messages ---- */

static size_t json_elem_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
    return 8;
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  default:
    return 4; /* 32-bit integers, float, enum, protobuf_c_boolean */
  }
}

static void json_value(FILE *f, const ProtobufCFieldDescriptor *fd, const void *p) {
  switch (fd->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
    fprintf(f, "%d", *(const int32_t *)p);
    break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32:
    fprintf(f, "%u", *(const uint32_t *)p);
    break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
    fprintf(f, "%lld", (long long)*(const int64_t *)p);
    break;
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)p);
    break;
  case PROTOBUF_C_TYPE_FLOAT:
    qe_json_num(f, *(const float *)p);
    break;
  case PROTOBUF_C_TYPE_DOUBLE:
    qe_json_num(f, *(const double *)p);
    break;
  case PROTOBUF_C_TYPE_BOOL:
    fputs(*(const protobuf_c_boolean *)p ? "true" : "false", f);
    break;
  case PROTOBUF_C_TYPE_ENUM: {
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(fd->descriptor, *(const int *)p);
    if (v)
      qe_json_str(f, v->name, strlen(v->name));
    else
      fprintf(f, "%d", *(const int *)p);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    qe_json_str(f, s ? s : "", s ? strlen(s) : 0);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE:
    cli_rpc_json(f, *(ProtobufCMessage *const *)p);
    break;
  default:
    fputs("null", f); /* bytes: none in the API */
  }
}

/* Whether a field is present: the set member of its oneof, a non-NULL message. */
static int json_present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd) {
  const char *base = (const char *)m;
  if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    return *(const uint32_t *)(base + fd->quantifier_offset) == fd->id;
  if (fd->label == PROTOBUF_C_LABEL_OPTIONAL && fd->quantifier_offset &&
      fd->type != PROTOBUF_C_TYPE_MESSAGE && fd->type != PROTOBUF_C_TYPE_STRING)
    return *(const protobuf_c_boolean *)(base + fd->quantifier_offset);
  if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED)
    return *(void *const *)(base + fd->offset) != NULL;
  return 1;
}

void cli_rpc_json(FILE *f, const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  int first = 1;
  fputc('{', f);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *fd = &d->fields[i];
    if (!json_present(m, fd)) continue;
    fprintf(f, "%s\"%s\":", first ? "" : ",", fd->name);
    first = 0;
    if (fd->label != PROTOBUF_C_LABEL_REPEATED) {
      json_value(f, fd, base + fd->offset);
      continue;
    }
    size_t n = *(const size_t *)(base + fd->quantifier_offset), sz = json_elem_size(fd->type);
    const char *arr = *(char *const *)(base + fd->offset);
    fputc('[', f);
    for (size_t j = 0; j < n; j++) {
      if (j) fputc(',', f);
      json_value(f, fd, arr + j * sz);
    }
    fputc(']', f);
  }
  fputc('}', f);
}

/* ---- options shared by the client commands ---- */

void cli_client_init(cli_client_opts_t *o, int admin) { *o = (cli_client_opts_t){.admin = admin}; }

int cli_client_parse(cli_client_opts_t *o, const char *f, const char *v) {
  double d;
  if (!strcmp(f, "--json")) return v ? 2 : (o->json = 1, 0);
  if (!strcmp(f, "--server")) return *v ? (o->server = v, 0) : 2;
  if (!strcmp(f, "--timeout")) {
    if (cli_parse_float(v, 1e-3, 1e7, &d)) return 2;
    o->timeout_s = d;
    return 0;
  }
  if (!strcmp(f, "--tls")) return v ? 2 : (o->tls = 1, 0);
  if (!v) return 1;
  const char **tf[] = {&o->tls_ca, &o->tls_cert, &o->tls_key, &o->tls_server_name};
  const char *tn[] = {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(f, tn[i])) return *v ? (*tf[i] = v, o->tls = 1, 0) : 2;
  if (!o->admin && !strcmp(f, "--key")) return *v ? (o->key = v, 0) : 2;
  if (!strcmp(f, o->admin ? "--admin-key-file" : "--key-file")) return o->key_file = v, 0;
  return 1;
}

/* The key in a file: its first 4 KiB, trailing white space (a newline) removed. */
static int read_key_file(const char *path, char **out) {
  char buf[4097];
  FILE *f = fopen(path, "rb");
  if (!f) return qe_errf(QE_EIO, "%s", strerror(errno));
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  int err = ferror(f) ? errno : 0, more = fgetc(f) != EOF;
  fclose(f);
  if (err) return qe_errf(QE_EIO, "%s", strerror(err));
  if (more) return qe_errf(QE_EINVAL, "longer than 4 KiB");
  while (n > 0 && isspace((unsigned char)buf[n - 1])) n--;
  buf[n] = '\0';
  if (!n) return qe_errf(QE_EINVAL, "it is empty");
  if (!key_is_printable(buf))
    return qe_errf(QE_EINVAL, "it has characters other than printable ASCII");
  return (*out = strdup(buf)) ? 0 : QE_ENOMEM;
}

static void tls_free(cli_rpc_tls_t *t) {
  if (t->key_pem) explicit_bzero((char *)t->key_pem, strlen(t->key_pem));
  free((char *)t->ca_pem), free((char *)t->cert_pem), free((char *)t->key_pem);
}

/* The TLS files of o (--tls-ca, else $QEVICT_TLS_CA; --tls-cert and --tls-key) read into t.
 * 0, or the exit code after a message. */
static int client_tls(const char *cmd, const cli_client_opts_t *o, cli_rpc_tls_t *t) {
  if (!o->tls_cert != !o->tls_key)
    return cli_usage_error(cmd, "give both --tls-cert and --tls-key, or neither");
  const char *env = getenv("QEVICT_TLS_CA");
  const char *ca = o->tls_ca ? o->tls_ca : env && *env ? env : NULL;
  const char *path[3] = {ca, o->tls_cert, o->tls_key};
  const char *flag[3] = {o->tls_ca ? "--tls-ca" : "$QEVICT_TLS_CA", "--tls-cert", "--tls-key"};
  const char *label[3] = {"CERTIFICATE", "CERTIFICATE", "PRIVATE KEY"};
  char **dst[3] = {(char **)&t->ca_pem, (char **)&t->cert_pem, (char **)&t->key_pem};
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++)
    rc = path[i] ? qe_read_pem(path[i], flag[i], label[i], dst[i]) : 0;
  if (!rc && t->cert_pem) /* (gRPC's own refusal was "empty address list") */
    rc = qe_tls_check_pair(t->cert_pem, t->key_pem, o->tls_cert, o->tls_key);
  if (!rc) return 0;
  fprintf(stderr, "qevict %s: %s\n", cmd, qe_errmsg());
  tls_free(t);
  return CLI_EXIT_USAGE;
}

int cli_client_open(const char *cmd, const cli_client_opts_t *o, cli_rpc_t **out) {
  const char *kf = o->admin ? "--admin-key-file" : "--key-file";
  const char *env = o->admin ? "QEVICT_ADMIN_KEY" : "QEVICT_API_KEY";
  const char *server = o->server, *key = o->key;
  char *file_key = NULL;
  *out = NULL;
  if (o->key && o->key_file) return cli_usage_error(cmd, "give only one of --key and --key-file");
  if (o->key_file && read_key_file(o->key_file, &file_key))
    return cli_usage_error(cmd, "bad key file '%s' for %s: %s", o->key_file, kf, qe_errmsg());
  if (!key) key = file_key;
  if (!key) key = getenv(env);
  if (key && !key_is_printable(key)) {
    free(file_key);
    return cli_usage_error(cmd, "the key from %s has characters other than printable ASCII",
                           o->key ? "--key" : env);
  }
  if (!server || !*server) server = getenv("QEVICT_SERVER");
  if (!server || !*server) server = "127.0.0.1:50051";
  if (!qe_target_ports_ok(server, 1)) {
    free(file_key);
    return cli_usage_error(cmd,
                           "bad server address '%.200s' (%s): HOST:PORT, [IPv6]:PORT or "
                           "ipv4:A:P,... with each port in 1..65535, a host name alone "
                           "(port 443), or unix:PATH",
                           server, o->server && *o->server ? "--server" : "QEVICT_SERVER");
  }
  cli_rpc_tls_t tls = {NULL, NULL, NULL, o->tls_server_name};
  int rc = client_tls(cmd, o, &tls);
  if (rc) {
    free(file_key);
    return rc;
  }
  rc = cli_rpc_connect(server, key, o->tls || tls.ca_pem ? &tls : NULL, out);
  free(file_key);
  tls_free(&tls);
  if (rc) return cli_client_fail(cmd, rc, NULL);
  return 0;
}

double cli_client_unary_timeout(const cli_client_opts_t *o) {
  return o->timeout_s > 0 ? o->timeout_s : CLI_RPC_UNARY_TIMEOUT_S;
}

int cli_client_fail(const char *cmd, int rc, const cli_rpc_status_t *st) {
  if (rc == QE_ECOMM && st) {
    fprintf(stderr, "qevict %s: %s: %s\n", cmd, qe_grpc_code_name(st->code, 0),
            *st->message ? st->message : "(no message)");
    return st->code == 16 /* UNAUTHENTICATED */ || st->code == 7 /* PERMISSION_DENIED */
               ? CLI_EXIT_AUTH
               : CLI_EXIT_RPC;
  }
  if (rc == QE_ECANCELED) {
    fprintf(stderr, "qevict %s: interrupted\n", cmd);
    return CLI_EXIT_INTERRUPTED;
  }
  const char *d = qe_errmsg();
  fprintf(stderr, "qevict %s: %s%s%s\n", cmd, qe_strerror(rc), *d ? ": " : "", d);
  return CLI_EXIT_RPC;
}

static int in_list(const char *const *list, const char *flag) {
  for (; list && *list; list++)
    if (!strcmp(*list, flag)) return 1;
  return 0;
}

/* One option at argv[*i] (its value may be the next word); see cli_args_parse. */
static int args_option(const char *cmd, int argc, char **argv, int *i, const char *const *no_value,
                       cli_opt_fn fn, void *ud) {
  const char *a = argv[*i], *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '='), *v = NULL;
  char flag[64];
  size_t fl = eq ? (size_t)(eq - a) : strlen(a);
  if (fl >= sizeof flag) return cli_usage_error(cmd, "unknown option %s", a);
  memcpy(flag, a, fl);
  flag[fl] = '\0';
  if (eq)
    v = eq + 1;
  else if (!in_list(no_value, flag) && strcmp(flag, "--tls")) {
    if (*i + 1 >= argc) return cli_usage_error(cmd, "unknown option or missing value: %s", flag);
    v = argv[++*i];
  }
  cli_parse_note_set(NULL);
  int rc = fn(ud, flag, v);
  if (rc == 1) return cli_usage_error(cmd, "unknown option %s", flag);
  if (rc == 2)
    return cli_usage_error(cmd, "bad value '%s' for %s%s", v ? v : "", flag, cli_parse_note());
  return rc ? CLI_EXIT_USAGE : 0;
}

int cli_args_parse(const char *cmd, int argc, char **argv, const char *help,
                   const char *const *no_value, cli_opt_fn fn, void *ud, const char **pos,
                   int max_pos, int *n_pos) {
  int only_pos = 0, rc;
  *n_pos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!only_pos && (!strcmp(a, "--help") || !strcmp(a, "-h"))) return fputs(help, stdout), -1;
    if (!only_pos && !strcmp(a, "--")) {
      only_pos = 1;
    } else if (only_pos || a[0] != '-' || !a[1]) {
      if (*n_pos >= max_pos) return cli_usage_error(cmd, "unexpected argument '%s'", a);
      pos[(*n_pos)++] = a;
    } else if ((rc = args_option(cmd, argc, argv, &i, no_value, fn, ud))) {
      return rc;
    }
  }
  return 0;
}

/* ---- values ---- */

int cli_parse_budget(const char *s, Qevict__V1__Budget *b) {
  size_t n = strlen(s);
  double d;
  uint64_t v;
  cli_parse_note_set(CLI_BUDGET_NOTE); /* (cleared again on success) */
  if (!n) return -1;
  int suffix = isalpha((unsigned char)s[n - 1]);
  if (!suffix && (strchr(s, '.') || !cli_parse_float(s, -1e300, 1.0, &d))) {
    if (cli_parse_float(s, 0.0, 1.0, &d) || !(d > 0))
      return cli_parse_note_set(CLI_BUDGET_NOTE), -1;
    b->kind_case = QEVICT__V1__BUDGET__KIND_FRACTION;
    b->fraction = d;
    return cli_parse_note_set(NULL), 0;
  }
  if (cli_parse_bytes(s, &v)) return cli_parse_note_set(CLI_BUDGET_NOTE), -1;
  b->kind_case = QEVICT__V1__BUDGET__KIND_BYTES;
  b->bytes = v;
  return 0;
}

const char *cli_fmt_budget(char *buf, size_t size, const Qevict__V1__Budget *b) {
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_FRACTION)
    snprintf(buf, size, "%.4g of FullKV", b->fraction);
  else if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES)
    cli_fmt_bytes(buf, size, b->bytes);
  else
    snprintf(buf, size, "-");
  return buf;
}

const char *cli_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t size) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  snprintf(buf, size, "?");
  if (!v) return buf;
  size_t pre = strlen(d->values[0].name); /* the prefix every value name shares, to a '_' */
  for (unsigned i = 0; i < d->n_values; i++) {
    size_t k = 0;
    while (k < pre && d->values[i].name[k] == d->values[0].name[k]) k++;
    pre = k;
  }
  while (pre > 0 && v->name[pre - 1] != '_') pre--;
  size_t j = 0;
  for (; v->name[pre + j] && j + 1 < size; j++)
    buf[j] = (char)tolower((unsigned char)v->name[pre + j]);
  buf[j] = '\0';
  return buf;
}
