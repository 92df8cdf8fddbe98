/* tjson: recursive-descent JSON parser for test fixtures. */
#include "tjson.h"

#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct {
  const char *p;
  int err;
} tj_cur_t;

static tj_t *tj_value(tj_cur_t *c);

static void tj_ws(tj_cur_t *c) {
  while (*c->p == ' ' || *c->p == '\n' || *c->p == '\t' || *c->p == '\r') c->p++;
}

static void tj_put_utf8(char *o, size_t *n, unsigned cp) {
  if (cp < 0x80)
    o[(*n)++] = (char)cp;
  else if (cp < 0x800)
    o[(*n)++] = (char)(0xC0 | cp >> 6), o[(*n)++] = (char)(0x80 | (cp & 63));
  else if (cp < 0x10000)
    o[(*n)++] = (char)(0xE0 | cp >> 12), o[(*n)++] = (char)(0x80 | ((cp >> 6) & 63)),
    o[(*n)++] = (char)(0x80 | (cp & 63));
  else
    o[(*n)++] = (char)(0xF0 | cp >> 18), o[(*n)++] = (char)(0x80 | ((cp >> 12) & 63)),
    o[(*n)++] = (char)(0x80 | ((cp >> 6) & 63)), o[(*n)++] = (char)(0x80 | (cp & 63));
}

static unsigned tj_hex4(tj_cur_t *c) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char h = *c->p++;
    v = v * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
  }
  return v;
}

static char *tj_string(tj_cur_t *c, size_t *len) {
  const char *start = ++c->p;
  size_t cap = 16;
  while (*c->p && *c->p != '"') cap++, c->p += *c->p == '\\' ? 2 : 1;
  c->p = start;
  char *o = malloc(cap * 4);
  size_t n = 0;
  while (*c->p && *c->p != '"') {
    char ch = *c->p++;
    if (ch != '\\') {
      o[n++] = ch;
      continue;
    }
    ch = *c->p++;
    if (ch == 'u') {
      unsigned cp = tj_hex4(c);
      if (cp >= 0xD800 && cp < 0xDC00 && c->p[0] == '\\' && c->p[1] == 'u') {
        c->p += 2;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (tj_hex4(c) - 0xDC00);
      }
      tj_put_utf8(o, &n, cp);
    } else
      o[n++] = ch == 'n'   ? '\n'
               : ch == 't' ? '\t'
               : ch == 'r' ? '\r'
               : ch == 'b' ? '\b'
               : ch == 'f' ? '\f'
                           : ch;
  }
  if (*c->p != '"')
    c->err = 1;
  else
    c->p++;
  o[n] = '\0';
  *len = n;
  return o;
}

static int tj_push(tj_t *j, tj_t *child) {
  tj_t **items = realloc(j->items, sizeof *items * (j->n + 1));
  if (!items) return -1;
  j->items = items;
  j->items[j->n++] = child;
  return 0;
}

static tj_t *tj_container(tj_cur_t *c, int obj) {
  tj_t *j = calloc(1, sizeof *j);
  j->type = obj ? TJ_OBJ : TJ_ARR;
  c->p++;
  tj_ws(c);
  while (!c->err && *c->p && *c->p != (obj ? '}' : ']')) {
    char *key = NULL;
    size_t kl;
    if (obj) {
      if (*c->p != '"') {
        c->err = 1;
        break;
      }
      key = tj_string(c, &kl);
      tj_ws(c);
      if (*c->p++ != ':') c->err = 1;
    }
    tj_t *v = tj_value(c);
    if (!v) {
      free(key);
      c->err = 1;
      break;
    }
    v->key = key;
    tj_push(j, v);
    tj_ws(c);
    if (*c->p == ',') c->p++, tj_ws(c);
  }
  if (*c->p) c->p++;
  return j;
}

static tj_t *tj_value(tj_cur_t *c) {
  tj_ws(c);
  char ch = *c->p;
  if (ch == '{' || ch == '[') return tj_container(c, ch == '{');
  tj_t *j = calloc(1, sizeof *j);
  if (ch == '"')
    j->type = TJ_STR, j->str = tj_string(c, &j->len);
  else if (!strncmp(c->p, "true", 4) || !strncmp(c->p, "false", 5))
    j->type = TJ_BOOL, j->num = ch == 't', c->p += ch == 't' ? 4 : 5;
  else if (!strncmp(c->p, "null", 4))
    j->type = TJ_NULL, c->p += 4;
  else {
    char *end;
    j->type = TJ_NUM;
    j->num = strtod(c->p, &end);
    if (end == c->p) c->err = 1;
    c->p = end;
  }
  return j;
}

tj_t *tj_parse(const char *text) {
  tj_cur_t c = {text, 0};
  tj_t *j = tj_value(&c);
  if (c.err) {
    tj_free(j);
    return NULL;
  }
  return j;
}

void tj_free(tj_t *j) {
  if (!j) return;
  for (size_t i = 0; i < j->n; i++) tj_free(j->items[i]);
  free(j->items);
  free(j->str);
  free(j->key);
  free(j);
}

const tj_t *tj_get(const tj_t *obj, const char *key) {
  for (size_t i = 0; obj && obj->type == TJ_OBJ && i < obj->n; i++)
    if (!strcmp(obj->items[i]->key, key)) return obj->items[i];
  return NULL;
}

tj_t *tj_load(const char *path) {
  char *text = tu_read_file(path, NULL);
  if (!text) return NULL;
  tj_t *j = tj_parse(text);
  free(text);
  return j;
}
