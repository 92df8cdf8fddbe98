/* kv_mux: one kv_cache_t over several child caches (kv_full, kv_tiered with any policy...),
 * so that every sequence can have its own KV policy and budget. Each of the mux's max_seqs
 * slots is bound, before it is opened, to a slot of a child; seq_open / seq_close / store /
 * seq_bytes go to the bound child slot, and attend groups a layer's requests by child and
 * calls each child's attend once (with the slots rewritten to the child's), so a batch may
 * mix sequences of different caches. The mux owns its children.
 * Not thread-safe: one engine thread drives a cache (like every kv_cache_t). */
#ifndef QE_KV_MUX_H
#define QE_KV_MUX_H

#include "kv_cache.h"

/* Creates an empty mux with geom->max_seqs slots (geometry checked like kv_full's). *out owned
 * by the caller: kv_cache_destroy() (which destroys the children too). QE_EINVAL, QE_ENOMEM. */
int kv_mux_create(kern_backend_t *be, const kv_geom_t *geom, kv_cache_t **out);

/* Adds child (on success the mux owns it; on failure the caller still does) and returns its id
 * (>= 0; ids of removed children are reused). QE_EINVAL if kv is not a mux, or the child's
 * geometry differs from the mux's in anything but max_seqs, or its backend differs. */
int kv_mux_add_child(kv_cache_t *kv, kv_cache_t *child, int *child_id);

/* Binds closed mux slot `slot` to slot `child_slot` of child `child_id` (replacing an earlier
 * binding). QE_EINVAL if the slot is open or out of range, the child or child slot does not
 * exist, or the child slot is in use by another open slot. */
int kv_mux_bind(kv_cache_t *kv, int slot, int child_id, int child_slot);

/* The child with id (borrowed; NULL if none), e.g. to set a kv_tiered budget or read its
 * stats at the slot kv_mux_lookup gives. */
kv_cache_t *kv_mux_child(const kv_cache_t *kv, int child_id);

/* Where slot is bound: QE_EINVAL if it is unbound (or out of range). */
int kv_mux_lookup(const kv_cache_t *kv, int slot, int *child_id, int *child_slot);

/* 1 if slot is open through the mux, else 0 (also for a slot out of range or a kv that is not
 * a mux). */
int kv_mux_is_open(const kv_cache_t *kv, int slot);

/* Destroys child id and unbinds the slots bound to it. QE_EINVAL (detail "... has open
 * slots"; qe_status has no EBUSY) while any of its slots is open through the mux, and for an
 * unknown id. */
int kv_mux_remove_child(kv_cache_t *kv, int child_id);

/* 1 while any slot of child id is open through the mux (kv_mux_remove_child would refuse it),
 * else 0 (also for an unknown id). */
int kv_mux_child_busy(const kv_cache_t *kv, int child_id);

/* Children currently held. */
int kv_mux_n_children(const kv_cache_t *kv);

#endif
