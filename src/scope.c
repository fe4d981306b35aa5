/* scope.c: owned buffers and scopes (regions freed as a whole). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

gpumem_status gpumem_buffer_alloc(gpumem_context *ctx, int device, size_t size, gpumem_stream stream,
                                  gpumem_buffer *out) {
  if (out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  void *p = NULL;
  gpumem_status st = gpumem_alloc(ctx, device, size, stream, &p);
  if (st != GPUMEM_OK) return st;
  out->ctx = ctx;
  out->ptr = p;
  out->size = size;
  out->device = device;
  out->stream = stream;
  return GPUMEM_OK;
}

void gpumem_buffer_release(gpumem_buffer *buf) {
  if (buf == NULL) return;
  if (buf->ctx != NULL && buf->ptr != NULL) (void)gpumem_free(buf->ctx, buf->ptr, buf->stream);
  memset(buf, 0, sizeof *buf);
}

/* A reset of the scope's device invalidates what the scope allocated before it; the address may
 * then be handed to someone else, so a scope frees only pointers allocated since the device's last
 * reset: it keeps the reset count (ctx->reset_gen) its pointers were allocated under, and forgets
 * them when the count moved. A pointer whose allocation raced a reset counts as allocated before it
 * (the reset count is read before the allocation): a reset racing the scope's own thread may leave
 * that one block live until the next reset or destroy, but never frees another owner's block. */
struct gpumem_scope {
  gpumem_context *ctx;
  int device;
  gpumem_stream stream;
  const char *tag;
  void **ptrs;
  size_t n, cap;
  uint64_t gen; /* ctx->reset_gen[device] when ptrs[0..n) were allocated */
};

static uint64_t scope_gen(const gpumem_scope *s) {
  return atomic_load_explicit(&s->ctx->reset_gen[s->device], memory_order_acquire);
}

gpumem_status gpumem_scope_begin(gpumem_context *ctx, int device, gpumem_stream stream, gpumem_scope **out) {
  if (ctx == NULL || out == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (GPUMEM__FORKED(ctx)) return gpumem__forked_status(ctx, __func__);
  int count = 0;
  (void)gpumem_device_count(ctx, &count);
  if (device < 0 || device >= count) return GPUMEM_ERR_INVALID_DEVICE;
  gpumem_scope *s = gpumem__calloc(1, sizeof *s);
  if (s == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
  s->ctx = ctx;
  s->device = device;
  s->stream = stream;
  s->gen = scope_gen(s);
  *out = s;
  return GPUMEM_OK;
}

gpumem_status gpumem_scope_alloc(gpumem_scope *scope, size_t size, void **out_ptr) {
  if (scope == NULL || out_ptr == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  if (size == 0) {
    *out_ptr = NULL;
    return GPUMEM_OK;
  }
  if (scope->n == scope->cap) { /* grow first, so that a host failure leaves nothing allocated */
    size_t ncap = scope->cap ? scope->cap * 2 : 16;
    void **np = gpumem__realloc(scope->ptrs, ncap * sizeof *np);
    if (np == NULL) return GPUMEM_ERR_OUT_OF_MEMORY;
    scope->ptrs = np;
    scope->cap = ncap;
  }
  uint64_t gen = scope_gen(scope);
  if (gen != scope->gen) { /* the device was reset: the pointers held so far are not ours any more */
    scope->n = 0;
    scope->gen = gen;
  }
  void *p = NULL;
  gpumem_status st = gpumem_alloc_tagged(scope->ctx, scope->device, size, scope->stream, scope->tag, &p);
  if (st != GPUMEM_OK) return st;
  scope->ptrs[scope->n++] = p;
  *out_ptr = p;
  return GPUMEM_OK;
}

gpumem_status gpumem_scope_set_tag(gpumem_scope *scope, const char *tag) {
  if (scope == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  scope->tag = tag;
  return GPUMEM_OK;
}

gpumem_status gpumem_scope_end(gpumem_scope *scope) {
  if (scope == NULL) return GPUMEM_ERR_INVALID_ARGUMENT;
  gpumem_status first = GPUMEM_OK;
  if (scope->n > 0 && scope_gen(scope) != scope->gen) scope->n = 0; /* reset since: invalidated already */
  /* newest first, like a stack */
  for (size_t i = scope->n; i > 0; i--) {
    gpumem_status st = gpumem_free(scope->ctx, scope->ptrs[i - 1], scope->stream);
    if (st != GPUMEM_OK && first == GPUMEM_OK) first = st;
  }
  free(scope->ptrs);
  free(scope);
  return first;
}
