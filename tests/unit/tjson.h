/* tjson: a small JSON reader for test fixtures (golden outputs, reference logits, tokenizer
 * cases). Parses a whole document into a tree; not for hostile input beyond fixtures. */
#ifndef QE_TJSON_H
#define QE_TJSON_H

#include <stddef.h>

typedef enum { TJ_NULL, TJ_BOOL, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ } tj_type_t;

typedef struct tj tj_t;
struct tj {
  tj_type_t type;
  double num;
  char *str;    /* TJ_STR value (NUL-terminated, may contain NUL: see len) or TJ_OBJ member key */
  size_t len;   /* string length */
  char *key;    /* key when this node is an object member */
  tj_t **items; /* children of arrays and objects */
  size_t n;
};

/* Parses text; NULL on syntax error. Free with tj_free. */
tj_t *tj_parse(const char *text);
void tj_free(tj_t *j);
/* Member of an object by key, or NULL. */
const tj_t *tj_get(const tj_t *obj, const char *key);
/* Loads and parses a file; NULL on failure. */
tj_t *tj_load(const char *path);

#endif
