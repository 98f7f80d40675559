/* The columnar half of the record codec, compiled: Arrow-style columns in, v2 records out,
   with no Python object per record. Producer.send_batch uses it; rayk.client.columns
   holds the Python reference that the property tests compare it with.

   A binary column is the buffers of an Arrow binary/string array, passed as a tuple
   (validity bitmap or None, int32 offsets, data or None, array offset): entry i is null
   when its validity bit is 0, else data[offsets[offset + i] : offsets[offset + i + 1]].

   encode_columns(values, keys, headers, timestamps, indices, start, stop, now_ms,
                  max_body_bytes) -> (body, count, base_timestamp, max_timestamp)

   Encodes records start, start+1, ... (of `indices`, an int64 buffer of row numbers, or
   the rows themselves when it is None) until `stop` or until the next record would take
   the body past `max_body_bytes` (the first record is always taken), as the records of
   one v2 batch: offset deltas 0..count-1, timestamp deltas from the first record. `keys`
   None means null keys. `headers` is None (no headers), bytes (one encoded headers
   section every record carries) or a list column (list validity or None, int32 list
   offsets, list array offset, key column, value column). `timestamps` is an int64 buffer
   of create times, or None for `now_ms`. Byte for byte what encode_records writes for the
   same records.

   murmur2_partitions(keys, count, num_partitions, out) -> None

   Writes into `out` (a writable int32 buffer of `count`) the partition Kafka's producer
   picks for each key, toPositive(murmur2(key)) % num_partitions, or -1 for a null key.

   murmur2(data) -> int

   Java's Utils.murmur2 of the bytes, as a signed 32-bit int.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_varint.h"
#include "_murmur2.h"

typedef struct {
    Py_buffer validity, offsets, data;
    int has_validity, has_data, has_offsets;
    Py_ssize_t offset; /* the array's offset into its buffers */
    Py_ssize_t length; /* entries addressable from that offset */
} Column;

static void column_close(Column *c)
{
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    if (c->has_data)
        PyBuffer_Release(&c->data);
    if (c->has_offsets)
        PyBuffer_Release(&c->offsets);
    c->has_validity = c->has_data = c->has_offsets = 0;
}

static int column_open(Column *c, PyObject *spec, const char *what)
{
    PyObject *validity, *offsets, *data;
    memset(c, 0, sizeof *c);
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "OOOn", &validity, &offsets, &data, &c->offset)) {
        PyErr_Format(PyExc_TypeError, "%s: a column is (validity, offsets, data, offset)", what);
        return -1;
    }
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0)
        return -1;
    c->has_offsets = 1;
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0)
            goto fail;
        c->has_validity = 1;
    }
    if (data != Py_None) {
        if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0)
            goto fail;
        c->has_data = 1;
    }
    c->length = (Py_ssize_t)(c->offsets.len / 4) - 1 - c->offset;
    if (c->offset < 0 || c->length < 0 ||
        (c->has_validity && c->validity.len * 8 < c->offset + c->length)) {
        PyErr_Format(PyExc_ValueError, "%s: the column's buffers are shorter than it", what);
        goto fail;
    }
    return 0;
fail:
    column_close(c);
    return -1;
}

/* Entry i: *len is -1 for null. */
static int column_get(const Column *c, Py_ssize_t i, const char *what, const uint8_t **ptr, Py_ssize_t *len)
{
    if (i < 0 || i >= c->length) {
        PyErr_Format(PyExc_IndexError, "%s: row %zd of a %zd-row column", what, i, c->length);
        return -1;
    }
    Py_ssize_t at = c->offset + i;
    if (c->has_validity && !(((const uint8_t *)c->validity.buf)[at >> 3] & (1 << (at & 7)))) {
        *len = -1;
        return 0;
    }
    const int32_t *offsets = (const int32_t *)c->offsets.buf;
    int32_t begin = offsets[at], end = offsets[at + 1];
    Py_ssize_t data_len = c->has_data ? c->data.len : 0;
    if (begin < 0 || end < begin || end > data_len) {
        PyErr_Format(PyExc_ValueError, "%s: row %zd's offsets %d..%d lie outside its %zd data bytes", what, i,
                     begin, end, data_len);
        return -1;
    }
    *ptr = c->has_data ? (const uint8_t *)c->data.buf + begin : NULL;
    *len = end - begin;
    return 0;
}

static Py_ssize_t field_size(Py_ssize_t len)
{
    return len < 0 ? 1 : varint_size(len) + len;
}

static void put_field(Out *o, const uint8_t *ptr, Py_ssize_t len)
{
    put_varint(o, len);
    if (len > 0) {
        memcpy(o->data + o->len, ptr, (size_t)len);
        o->len += len;
    }
}

/* A list column of (key, value) structs: each row's headers. */
typedef struct {
    Py_buffer validity, offsets;
    int has_validity, has_offsets;
    Py_ssize_t offset, length;
    Column keys, values;
    int keys_open, values_open;
} HeaderColumn;

static void headers_close(HeaderColumn *h)
{
    if (h->has_validity)
        PyBuffer_Release(&h->validity);
    if (h->has_offsets)
        PyBuffer_Release(&h->offsets);
    if (h->keys_open)
        column_close(&h->keys);
    if (h->values_open)
        column_close(&h->values);
    h->has_validity = h->has_offsets = h->keys_open = h->values_open = 0;
}

static int headers_open(HeaderColumn *h, PyObject *spec)
{
    PyObject *validity, *offsets, *keys, *values;
    memset(h, 0, sizeof *h);
    if (!PyArg_ParseTuple(spec, "OOnOO", &validity, &offsets, &h->offset, &keys, &values)) {
        PyErr_SetString(PyExc_TypeError, "headers: a list column is (validity, offsets, offset, keys, values)");
        return -1;
    }
    if (PyObject_GetBuffer(offsets, &h->offsets, PyBUF_SIMPLE) < 0)
        return -1;
    h->has_offsets = 1;
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &h->validity, PyBUF_SIMPLE) < 0)
            goto fail;
        h->has_validity = 1;
    }
    h->length = (Py_ssize_t)(h->offsets.len / 4) - 1 - h->offset;
    if (h->offset < 0 || h->length < 0 || (h->has_validity && h->validity.len * 8 < h->offset + h->length)) {
        PyErr_SetString(PyExc_ValueError, "headers: the column's buffers are shorter than it");
        goto fail;
    }
    if (column_open(&h->keys, keys, "header keys") < 0)
        goto fail;
    h->keys_open = 1;
    if (column_open(&h->values, values, "header values") < 0)
        goto fail;
    h->values_open = 1;
    return 0;
fail:
    headers_close(h);
    return -1;
}

/* Row i's headers as [first, end) of the key/value columns. */
static int headers_range(const HeaderColumn *h, Py_ssize_t i, Py_ssize_t *first, Py_ssize_t *end)
{
    if (i < 0 || i >= h->length) {
        PyErr_Format(PyExc_IndexError, "headers: row %zd of a %zd-row column", i, h->length);
        return -1;
    }
    Py_ssize_t at = h->offset + i;
    if (h->has_validity && !(((const uint8_t *)h->validity.buf)[at >> 3] & (1 << (at & 7)))) {
        *first = *end = 0;
        return 0;
    }
    const int32_t *offsets = (const int32_t *)h->offsets.buf;
    *first = offsets[at];
    *end = offsets[at + 1];
    if (*first < 0 || *end < *first) {
        PyErr_Format(PyExc_ValueError, "headers: row %zd has list offsets %zd..%zd", i, *first, *end);
        return -1;
    }
    return 0;
}

/* The bytes of row i's headers section (count varint and entries). */
static int headers_size(const HeaderColumn *h, Py_ssize_t i, Py_ssize_t *size)
{
    Py_ssize_t first, end, total;
    if (headers_range(h, i, &first, &end) < 0)
        return -1;
    total = varint_size(end - first);
    for (Py_ssize_t j = first; j < end; j++) {
        const uint8_t *ptr;
        Py_ssize_t key_len, value_len;
        if (column_get(&h->keys, j, "header keys", &ptr, &key_len) < 0 ||
            column_get(&h->values, j, "header values", &ptr, &value_len) < 0)
            return -1;
        if (key_len < 0) {
            PyErr_SetString(PyExc_ValueError, "record header key is null");
            return -1;
        }
        total += field_size(key_len) + field_size(value_len);
    }
    *size = total;
    return 0;
}

static void put_headers(Out *o, const HeaderColumn *h, Py_ssize_t i) /* checked by headers_size */
{
    Py_ssize_t first, end;
    headers_range(h, i, &first, &end);
    put_varint(o, end - first);
    for (Py_ssize_t j = first; j < end; j++) {
        const uint8_t *key, *value;
        Py_ssize_t key_len, value_len;
        column_get(&h->keys, j, "header keys", &key, &key_len);
        column_get(&h->values, j, "header values", &value, &value_len);
        put_field(o, key, key_len);
        put_field(o, value, value_len);
    }
}

static PyObject *encode_columns(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *values_spec, *keys_spec, *headers_spec, *timestamps_obj, *indices_obj, *result = NULL;
    Py_ssize_t start, stop, max_body_bytes;
    long long now_ms;
    Column values = {0}, keys = {0};
    HeaderColumn headers = {0};
    int keys_open = 0, headers_open_ = 0, values_open = 0;
    Py_buffer shared = {0}, timestamps = {0}, indices = {0};
    int has_shared = 0, has_timestamps = 0, has_indices = 0;
    Out o = {NULL, 0, 0};

    if (!PyArg_ParseTuple(args, "OOOOOnnLn:encode_columns", &values_spec, &keys_spec, &headers_spec, &timestamps_obj,
                          &indices_obj, &start, &stop, &now_ms, &max_body_bytes))
        return NULL;
    if (column_open(&values, values_spec, "values") < 0)
        return NULL;
    values_open = 1;
    if (keys_spec != Py_None) {
        if (column_open(&keys, keys_spec, "keys") < 0)
            goto done;
        keys_open = 1;
    }
    if (PyBytes_Check(headers_spec)) {
        if (PyObject_GetBuffer(headers_spec, &shared, PyBUF_SIMPLE) < 0)
            goto done;
        has_shared = 1;
    } else if (headers_spec != Py_None) {
        if (headers_open(&headers, headers_spec) < 0)
            goto done;
        headers_open_ = 1;
    }
    if (timestamps_obj != Py_None) {
        if (PyObject_GetBuffer(timestamps_obj, &timestamps, PyBUF_SIMPLE) < 0)
            goto done;
        has_timestamps = 1;
    }
    if (indices_obj != Py_None) {
        if (PyObject_GetBuffer(indices_obj, &indices, PyBUF_SIMPLE) < 0)
            goto done;
        has_indices = 1;
        if (stop > (Py_ssize_t)(indices.len / 8)) {
            PyErr_SetString(PyExc_IndexError, "stop is past the end of indices");
            goto done;
        }
    }
    if (start < 0 || stop <= start) {
        PyErr_SetString(PyExc_ValueError, "a record batch needs at least one record");
        goto done;
    }
    int64_t base = 0, max_timestamp = 0;
    Py_ssize_t count = 0;
    for (Py_ssize_t k = start; k < stop; k++) {
        Py_ssize_t row = has_indices ? (Py_ssize_t)((const int64_t *)indices.buf)[k] : k;
        const uint8_t *key = NULL, *value = NULL;
        Py_ssize_t key_len = -1, value_len, headers_bytes;
        int64_t ts = now_ms, delta;
        if (column_get(&values, row, "values", &value, &value_len) < 0)
            goto done;
        if (keys_open && column_get(&keys, row, "keys", &key, &key_len) < 0)
            goto done;
        if (has_timestamps) {
            if (row < 0 || row >= (Py_ssize_t)(timestamps.len / 8)) {
                PyErr_Format(PyExc_IndexError, "timestamps: row %zd of %zd", row, (Py_ssize_t)(timestamps.len / 8));
                goto done;
            }
            ts = ((const int64_t *)timestamps.buf)[row];
        }
        if (headers_open_) {
            if (headers_size(&headers, row, &headers_bytes) < 0)
                goto done;
        } else {
            headers_bytes = has_shared ? shared.len : 1;
        }
        int64_t record_base = count == 0 ? ts : base;
        int64_t record_max = count == 0 || ts > max_timestamp ? ts : max_timestamp;
        if (__builtin_sub_overflow(ts, record_base, &delta)) {
            PyErr_Format(PyExc_ValueError, "varint out of int64 range: %lld - %lld", (long long)ts,
                         (long long)record_base);
            goto done;
        }
        Py_ssize_t size = 1 + varint_size(delta) + varint_size(count) + field_size(key_len) + field_size(value_len) +
                          headers_bytes;
        if (count > 0 && o.len + varint_size(size) + size > max_body_bytes)
            break; /* the batch is full */
        base = record_base;
        max_timestamp = record_max;
        if (out_reserve(&o, varint_size(size) + size) < 0)
            goto done;
        put_varint(&o, size);
        o.data[o.len++] = 0; /* attributes: unused */
        put_varint(&o, delta);
        put_varint(&o, count);
        put_field(&o, key, key_len);
        put_field(&o, value, value_len);
        if (headers_open_) {
            put_headers(&o, &headers, row);
        } else if (has_shared) {
            memcpy(o.data + o.len, shared.buf, (size_t)shared.len);
            o.len += shared.len;
        } else {
            o.data[o.len++] = 0; /* no headers */
        }
        count++;
    }
    PyObject *body = PyBytes_FromStringAndSize(o.data, o.len);
    if (body != NULL)
        result = Py_BuildValue("(NnLL)", body, count, (long long)base, (long long)max_timestamp);
done:
    PyMem_Free(o.data);
    if (values_open)
        column_close(&values);
    if (keys_open)
        column_close(&keys);
    if (headers_open_)
        headers_close(&headers);
    if (has_shared)
        PyBuffer_Release(&shared);
    if (has_timestamps)
        PyBuffer_Release(&timestamps);
    if (has_indices)
        PyBuffer_Release(&indices);
    return result;
}

static PyObject *murmur2(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:murmur2", &data))
        return NULL;
    int32_t h = murmur2_of((const uint8_t *)data.buf, data.len);
    PyBuffer_Release(&data);
    return PyLong_FromLong(h);
}

static PyObject *murmur2_partitions(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *keys_spec, *out_obj, *result = NULL;
    Py_ssize_t count, num_partitions;
    Column keys;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "OnnO:murmur2_partitions", &keys_spec, &count, &num_partitions, &out_obj))
        return NULL;
    if (num_partitions < 1) {
        PyErr_Format(PyExc_ValueError, "a topic has at least one partition, not %zd", num_partitions);
        return NULL;
    }
    if (column_open(&keys, keys_spec, "keys") < 0)
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0) {
        column_close(&keys);
        return NULL;
    }
    if (out.len / 4 < count || keys.length < count) {
        PyErr_SetString(PyExc_ValueError, "murmur2_partitions: out or keys is shorter than count");
        goto done;
    }
    int32_t *partitions = (int32_t *)out.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *key;
        Py_ssize_t len;
        if (column_get(&keys, i, "keys", &key, &len) < 0)
            goto done;
        partitions[i] = len < 0 ? -1 : (int32_t)murmur2_partition(key, len, num_partitions);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&out);
    column_close(&keys);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_columns", encode_columns, METH_VARARGS,
     "encode_columns(values, keys, headers, timestamps, indices, start, stop, now_ms, max_body_bytes)"
     " -> (body, count, base timestamp, max timestamp)."},
    {"murmur2_partitions", murmur2_partitions, METH_VARARGS,
     "murmur2_partitions(keys, count, num_partitions, out): each key's partition (-1 for null) into out."},
    {"murmur2", murmur2, METH_VARARGS, "murmur2(data) -> Java's Utils.murmur2 as a signed 32-bit int."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "Columns in, Kafka v2 records out; murmur2 partitioning.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columns(void)
{
    return PyModule_Create(&module);
}
