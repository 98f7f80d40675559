/* The output buffer and zig-zag varint writer shared by the compiled record encoders
   (_records.c, _columns.c): Kafka's v2 records are varint-framed. Header-only, static. */
#ifndef RAYK_VARINT_H
#define RAYK_VARINT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;

static inline int out_reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *data = PyMem_Realloc(o->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

static inline int varint_size(int64_t value)
{
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 1;
    while (z > 0x7F) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline void put_varint(Out *o, int64_t value) /* room reserved by the caller */
{
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (z > 0x7F) {
        o->data[o->len++] = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    o->data[o->len++] = (char)z;
}

#endif
