/* Java's Utils.murmur2, shared by the compiled modules that pick a keyed record's
   partition (_columns.c for send_batch, rayk/client/_send.c for send): the reference is
   rayk.client.partitioner.murmur2. Header-only, static. */
#ifndef RAYK_MURMUR2_H
#define RAYK_MURMUR2_H

#include <Python.h>
#include <stdint.h>

static inline int32_t murmur2_of(const uint8_t *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t tail = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < tail; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) | ((uint32_t)data[i + 2] << 16) |
                     ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = (h * m) ^ k;
    }
    switch (length & 3) { /* Java's fall-through */
    case 3:
        h ^= (uint32_t)data[tail + 2] << 16; /* fall through */
    case 2:
        h ^= (uint32_t)data[tail + 1] << 8; /* fall through */
    case 1:
        h ^= (uint32_t)data[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

/* Kafka's toPositive(murmur2(key)) % num_partitions (num_partitions >= 1). */
static inline Py_ssize_t murmur2_partition(const uint8_t *key, Py_ssize_t length, Py_ssize_t num_partitions)
{
    return (Py_ssize_t)((uint32_t)(murmur2_of(key, length) & 0x7fffffff) % (uint32_t)num_partitions);
}

#endif
