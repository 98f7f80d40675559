/* The per-record halves of rayk.storage.records, compiled: a walk that checks records and
   an encoder that writes them. Both exist because per-record Python cost ~1 us a record on
   the leader and in the producer; the Python versions stay as the reference that the
   property tests compare these with.

   scan_records(body, record_count) -> int | None

   Walks `record_count` v2 records in `body` (a batch's records, decompressed) without
   building them, and checks what rayk.storage.records.scan_records_reference checks, with
   the same messages: each record's fields lie inside its declared length, offset deltas
   run 0..n-1, header keys are present and UTF-8, and the records fill the body exactly.
   Returns the largest timestamp delta (None for no records). Raises ValueError naming the
   first problem; never reads outside `body`, whatever its bytes are.

   decode_records(body, record_count, base_offset, base_timestamp, append_time) -> list

   Checks the records as scan_records does (same ValueError), except that offset deltas
   need only grow (a batch thinned by log compaction keeps its records' offsets), then
   returns each as a tuple
   (offset, timestamp, key, value, headers): absolute offset, timestamp (`append_time`
   for every record when it is >= 0, a LogAppendTime batch), key and value as bytes or
   None, headers a list of (str, bytes | None). records.decode_records_reference is the
   same in Python.

   decode_consumer_records(body, record_count, base_offset, base_timestamp, append_time,
                           record_type, topic, partition, timestamp_type, start_offset) -> list

   decode_records' checks and records, each built as a `record_type` (a tuple type: the
   consumer's ConsumerRecord) of (topic, partition, offset, timestamp, timestamp_type, key,
   value, headers, len(key) or -1, len(value) or -1), leaving out those before
   `start_offset`: the consumer's iteration without a Python step per record.
   records.decode_consumer_records_reference is the same in Python.

   decode_columns(batches) -> tuple

   The records of a sequence of batches, each given as (body, record_count, base_offset,
   base_timestamp, append_time), as one set of column buffers in Arrow's layouts, with no
   Python object per record (the columnar consumer's path; rayk.client.arrow_batches wraps
   them):
   (offsets int64[n], timestamps int64[n],
    key validity bitmap, key offsets int32[n+1], key bytes,
    value validity bitmap, value offsets int32[n+1], value bytes,
    header list offsets int32[n+1],
    header key offsets int32[h+1], header key bytes (UTF-8, checked by the walk),
    header value validity bitmap, header value offsets int32[h+1], header value bytes),
   every one a bytes object, native byte order; n counts the records of all batches. Each
   batch gets the checks of decode_records; the ValueError names the first malformed batch,
   "batch at offset <base_offset>: <scan_records' message>". With 64 KiB of bodies or
   more, the measuring and copying run without the GIL, so a consumer's receiving thread
   goes on meanwhile (poll_batch 20-28% faster).

   encode_records(records, now_ms) -> (body, base_timestamp, max_timestamp)

   Encodes records, (value, key, headers, timestamp_ms) tuples such as SimpleRecord or
   objects with those attributes (a None timestamp is `now_ms`), as the records of a v2
   batch with offset deltas 0..n-1 and timestamp deltas from the first record: byte for
   byte what records.encode_records_reference writes.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "_varint.h"

typedef struct {
    const uint8_t *buf;
    Py_ssize_t end;
    Py_ssize_t pos;
    char message[200]; /* set when a read fails */
} Cursor;

static const char PAST_END[] = "records running past its end";

/* One zig-zag varint of up to 10 bytes (Kafka's readVarlong). Returns 0, or -1 with
   cursor->message set. */
static int read_varint(Cursor *c, int64_t *out)
{
    if (c->pos < c->end && c->buf[c->pos] < 0x80) { /* one byte: most lengths and deltas */
        uint64_t b = c->buf[c->pos++];
        *out = (int64_t)((b >> 1) ^ (0 - (b & 1)));
        return 0;
    }
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= c->end) {
            snprintf(c->message, sizeof c->message, "%s", PAST_END);
            return -1;
        }
        uint8_t b = c->buf[c->pos++];
        if (shift == 63) { /* the tenth byte: it may carry one more bit, and must end the varint */
            if (b & 0x80) {
                snprintf(c->message, sizeof c->message, "varint is longer than 10 bytes");
                return -1;
            }
            if (b & 0x7E) {
                snprintf(c->message, sizeof c->message, "varint out of int64 range");
                return -1;
            }
        }
        z |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    *out = (int64_t)((z >> 1) ^ (0 - (z & 1)));
    return 0;
}

/* Skips a length-prefixed field whose length was just read (negative = null). */
static int skip_field(Cursor *c, int64_t length)
{
    if (length <= 0)
        return 0;
    if (length > c->end - c->pos) {
        snprintf(c->message, sizeof c->message, "%s", PAST_END);
        return -1;
    }
    c->pos += (Py_ssize_t)length;
    return 0;
}

/* One record. Its offset delta must be `expected_delta` when `strict` (a producer's batch:
   deltas 0..n-1), else at least `expected_delta` (a batch read from a log, which compaction
   may have thinned: deltas only grow). */
static int scan_record(Cursor *c, int64_t expected_delta, int strict, int64_t *timestamp_delta, int64_t *offset_delta_out)
{
    int64_t length, offset_delta, key_length, value_length, header_count;
    if (read_varint(c, &length) < 0)
        return -1;
    if (length <= 0 || length > c->end - c->pos) {
        snprintf(c->message, sizeof c->message, "record length %lld does not fit in the batch", (long long)length);
        return -1;
    }
    Py_ssize_t record_end = c->pos + (Py_ssize_t)length;
    c->pos += 1; /* attributes: unused */
    if (read_varint(c, timestamp_delta) < 0 || read_varint(c, &offset_delta) < 0)
        return -1;
    if (strict ? offset_delta != expected_delta : offset_delta < expected_delta) {
        snprintf(c->message, sizeof c->message, "record offset delta %lld, expected %s%lld", (long long)offset_delta,
                 strict ? "" : "at least ", (long long)expected_delta);
        return -1;
    }
    if (offset_delta > INT32_MAX) { /* an int32 in Kafka's batches */
        snprintf(c->message, sizeof c->message, "record offset delta %lld is beyond int32", (long long)offset_delta);
        return -1;
    }
    *offset_delta_out = offset_delta;
    if (read_varint(c, &key_length) < 0 || skip_field(c, key_length) < 0)
        return -1;
    if (read_varint(c, &value_length) < 0 || skip_field(c, value_length) < 0)
        return -1;
    if (read_varint(c, &header_count) < 0)
        return -1;
    if (header_count < 0) {
        snprintf(c->message, sizeof c->message, "invalid header count %lld", (long long)header_count);
        return -1;
    }
    for (int64_t h = 0; h < header_count; h++) { /* each header takes >= 2 bytes: bounded */
        int64_t header_key_length, header_value_length;
        if (read_varint(c, &header_key_length) < 0)
            return -1;
        if (header_key_length < 0) {
            snprintf(c->message, sizeof c->message, "record header key is null");
            return -1;
        }
        if (header_key_length > c->end - c->pos) {
            snprintf(c->message, sizeof c->message, "%s", PAST_END);
            return -1;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)c->buf + c->pos, (Py_ssize_t)header_key_length, "strict");
        if (key == NULL) {
            PyErr_Clear();
            snprintf(c->message, sizeof c->message, "a header key that is not UTF-8");
            return -1;
        }
        Py_DECREF(key);
        c->pos += (Py_ssize_t)header_key_length;
        if (read_varint(c, &header_value_length) < 0 || skip_field(c, header_value_length) < 0)
            return -1;
    }
    if (c->pos != record_end) {
        snprintf(c->message, sizeof c->message, "record declares %lld bytes but its fields take %lld",
                 (long long)length, (long long)(length + c->pos - record_end));
        return -1;
    }
    return 0;
}

/* The walk over `record_count` records of body: 0, or -1 with c->message set. `strict`:
   offset deltas run 0..n-1 (a producer's batch); else they only grow (a compacted one). */
static int scan_body(Cursor *c, Py_ssize_t record_count, int strict, int64_t *max_timestamp_delta)
{
    *max_timestamp_delta = 0;
    int64_t expected_delta = 0;
    for (Py_ssize_t i = 0; i < record_count; i++) {
        int64_t timestamp_delta, offset_delta;
        if (scan_record(c, expected_delta, strict, &timestamp_delta, &offset_delta) < 0)
            return -1;
        expected_delta = offset_delta + 1;
        if (i == 0 || timestamp_delta > *max_timestamp_delta)
            *max_timestamp_delta = timestamp_delta;
    }
    if (c->pos != c->end) {
        snprintf(c->message, sizeof c->message, "%lld bytes after its last record", (long long)(c->end - c->pos));
        return -1;
    }
    return 0;
}

static PyObject *scan_records(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer body;
    Py_ssize_t record_count;
    if (!PyArg_ParseTuple(args, "y*n:scan_records", &body, &record_count))
        return NULL;
    Cursor c = {.buf = (const uint8_t *)body.buf, .end = body.len, .pos = 0};
    int64_t max_timestamp_delta;
    int failed = scan_body(&c, record_count, 1, &max_timestamp_delta) < 0;
    PyBuffer_Release(&body);
    if (failed) {
        PyErr_SetString(PyExc_ValueError, c.message);
        return NULL;
    }
    if (record_count <= 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(max_timestamp_delta);
}

/* ------------------------------------------------------------------ decode */

/* Whether the buffer's exporter is bytes, or a memoryview of bytes: memory no code can
   change while it is read. */
static int is_immutable_bytes(PyObject *exporter)
{
    if (exporter != NULL && PyMemoryView_Check(exporter))
        exporter = PyMemoryView_GET_BASE(exporter);
    return exporter != NULL && PyBytes_CheckExact(exporter);
}

/* The decoders walk a body once to check it, then read it again trusting that walk, and
   Python code can run in between (an __index__ of a later argument, a collection's
   callbacks and finalizers on any allocation, another thread once the GIL is released).
   A body that could change meanwhile (a bytearray, a view of one, any other exporter) is
   first copied into bytes, so what was checked is what is read. 0, or -1 with an
   exception set and the view released. */
static int hold_immutable(Py_buffer *view)
{
    if (is_immutable_bytes(view->obj))
        return 0;
    PyObject *copy = PyBytes_FromStringAndSize((const char *)view->buf, view->len); /* bytes: no collection */
    PyBuffer_Release(view);
    if (copy == NULL)
        return -1;
    int failed = PyObject_GetBuffer(copy, view, PyBUF_SIMPLE);
    Py_DECREF(copy); /* the view holds it */
    return failed;
}

/* One length-prefixed field as bytes, or None for a negative length; the walk checked it. */
static PyObject *take_field(Cursor *c)
{
    int64_t length;
    read_varint(c, &length);
    if (length < 0)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize((const char *)c->buf + c->pos, (Py_ssize_t)length);
    c->pos += (Py_ssize_t)length;
    return out;
}

/* One record at the cursor, which scan_body checked: its deltas, key and value (bytes or
   None) and headers (a list of (str, bytes | None)), new references. 0, or -1 with an
   exception set and nothing left to release. */
typedef struct {
    int64_t timestamp_delta, offset_delta;
    PyObject *key, *value, *headers;
} TakenRecord;

static int take_record(Cursor *c, TakenRecord *r)
{
    int64_t length, header_count;
    read_varint(c, &length);
    c->pos += 1; /* attributes: unused */
    read_varint(c, &r->timestamp_delta);
    read_varint(c, &r->offset_delta);
    r->key = take_field(c);
    r->value = take_field(c);
    r->headers = NULL;
    read_varint(c, &header_count);
    if (r->key != NULL && r->value != NULL)
        r->headers = PyList_New((Py_ssize_t)header_count);
    for (int64_t h = 0; r->headers != NULL && h < header_count; h++) {
        int64_t key_length;
        read_varint(c, &key_length);
        PyObject *header_key = PyUnicode_DecodeUTF8((const char *)c->buf + c->pos, (Py_ssize_t)key_length, "strict");
        c->pos += (Py_ssize_t)key_length;
        PyObject *header_value = take_field(c);
        PyObject *pair = header_key && header_value ? PyTuple_Pack(2, header_key, header_value) : NULL;
        Py_XDECREF(header_key);
        Py_XDECREF(header_value);
        if (pair == NULL)
            Py_CLEAR(r->headers);
        else
            PyList_SET_ITEM(r->headers, (Py_ssize_t)h, pair);
    }
    if (r->headers == NULL) {
        Py_CLEAR(r->key);
        Py_CLEAR(r->value);
        return -1;
    }
    return 0;
}

static void release_record(TakenRecord *r)
{
    Py_CLEAR(r->key);
    Py_CLEAR(r->value);
    Py_CLEAR(r->headers);
}

/* The checks decode_records and decode_consumer_records share: 0, or -1 with ValueError set. */
static int check_decodable(Cursor *c, Py_ssize_t record_count)
{
    if (record_count < 0) {
        PyErr_Format(PyExc_ValueError, "record count %zd", record_count);
        return -1;
    }
    int64_t max_timestamp_delta;
    if (scan_body(c, record_count, 0, &max_timestamp_delta) < 0) { /* scan_records' checks, deltas may skip */
        PyErr_SetString(PyExc_ValueError, c->message);
        return -1;
    }
    c->pos = 0;
    return 0;
}

static PyObject *decode_records(PyObject *module, PyObject *args)
{
    PyObject *out = NULL;
    Py_buffer body;
    Py_ssize_t record_count;
    long long base_offset, base_timestamp, append_time;
    if (!PyArg_ParseTuple(args, "y*nLLL:decode_records", &body, &record_count, &base_offset, &base_timestamp,
                          &append_time) || hold_immutable(&body) < 0)
        return NULL;
    (void)module;
    Cursor c = {.buf = (const uint8_t *)body.buf, .end = body.len, .pos = 0};
    if (check_decodable(&c, record_count) < 0 || (out = PyList_New(record_count)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < record_count; i++) {
        TakenRecord r;
        PyObject *record = NULL;
        if (take_record(&c, &r) == 0) {
            long long timestamp = append_time >= 0 ? append_time : base_timestamp + r.timestamp_delta;
            record = Py_BuildValue("(LLOOO)", base_offset + r.offset_delta, timestamp, r.key, r.value, r.headers);
            release_record(&r);
        }
        if (record == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, record);
    }
done:
    PyBuffer_Release(&body);
    return out;
}

/* len() of a key or value, -1 for None: ConsumerRecord's serialized sizes. */
static PyObject *serialized_size(PyObject *field)
{
    return PyLong_FromSsize_t(field == Py_None ? -1 : PyBytes_GET_SIZE(field));
}

/* A decoded record and its headers (a list of (str, bytes | None) pairs) hold no
   container but the headers: they cannot be part of a reference cycle, so the cyclic GC
   has nothing to find in them. Left tracked, every collection walks them: a consumer
   iterating 1 M records spent ~a fifth of its read in collections (CPython untracks exact
   tuples itself, never a tuple subclass such as ConsumerRecord, nor a list). Refcounting
   still frees them. Only a program that appends to a record's headers something that
   refers back to that record or list would make a cycle the GC cannot collect (a leak,
   not a crash: a list is never tracked again). */
static void untrack_record(PyObject *record, PyObject *headers)
{
    for (Py_ssize_t h = 0; h < PyList_GET_SIZE(headers); h++)
        PyObject_GC_UnTrack(PyList_GET_ITEM(headers, h)); /* a (str, bytes | None) tuple */
    PyObject_GC_UnTrack(headers);
    PyObject_GC_UnTrack(record);
}

static PyObject *decode_consumer_records(PyObject *module, PyObject *args)
{
    PyObject *out = NULL, *topic, *partition, *timestamp_type;
    /* Records of a batch mostly share their timestamp with the one before (a producer sends
       hundreds a millisecond): one int object for a run of them, not one each. */
    PyObject *last_timestamp = NULL;
    long long last_timestamp_value = 0;
    PyTypeObject *record_type;
    Py_buffer body;
    Py_ssize_t record_count;
    long long base_offset, base_timestamp, append_time, start_offset;
    if (!PyArg_ParseTuple(args, "y*nLLLO!OOOL:decode_consumer_records", &body, &record_count, &base_offset,
                          &base_timestamp, &append_time, &PyType_Type, &record_type, &topic, &partition,
                          &timestamp_type, &start_offset) || hold_immutable(&body) < 0)
        return NULL;
    (void)module;
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        goto done;
    }
    /* A record type whose instances have a __dict__ could be given attributes that make a
       cycle: those stay tracked. */
    int untrack = record_type->tp_dictoffset == 0;
    Cursor c = {.buf = (const uint8_t *)body.buf, .end = body.len, .pos = 0};
    if (check_decodable(&c, record_count) < 0 || (out = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < record_count; i++) {
        TakenRecord r;
        if (take_record(&c, &r) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        long long offset = base_offset + r.offset_delta;
        if (offset < start_offset) { /* a batch that starts before the position asked for */
            release_record(&r);
            continue;
        }
        long long timestamp = append_time >= 0 ? append_time : base_timestamp + r.timestamp_delta;
        if (last_timestamp == NULL || timestamp != last_timestamp_value) {
            Py_XSETREF(last_timestamp, PyLong_FromLongLong(timestamp));
            last_timestamp_value = timestamp;
        }
        PyObject *items[10] = {
            Py_NewRef(topic), Py_NewRef(partition), PyLong_FromLongLong(offset), Py_XNewRef(last_timestamp),
            Py_NewRef(timestamp_type), r.key, r.value, r.headers, serialized_size(r.key), serialized_size(r.value),
        };
        PyObject *record = record_type->tp_alloc(record_type, 10);
        int failed = record == NULL;
        for (Py_ssize_t k = 0; k < 10; k++) {
            failed |= items[k] == NULL;
            if (record != NULL)
                PyTuple_SET_ITEM(record, k, items[k]); /* stolen; NULL ones are fine to the tuple's dealloc */
            else
                Py_XDECREF(items[k]);
        }
        if (failed || PyList_Append(out, record) < 0) {
            Py_XDECREF(record);
            Py_CLEAR(out);
            goto done;
        }
        if (untrack)
            untrack_record(record, r.headers);
        Py_DECREF(record);
    }
done:
    Py_XDECREF(last_timestamp);
    PyBuffer_Release(&body);
    return out;
}

/* ------------------------------------------------------------------ decode to columns */

/* A length-prefixed field's length and start; the walk checked it. */
static int64_t next_field(Cursor *c, const uint8_t **start)
{
    int64_t length;
    read_varint(c, &length);
    *start = c->buf + c->pos;
    if (length > 0)
        c->pos += (Py_ssize_t)length;
    return length;
}

typedef struct { /* one Arrow binary column being filled: validity, int32 offsets, bytes */
    uint8_t *valid; /* NULL for a column that has no nulls (header keys) */
    int32_t *offsets;
    char *data;
    int32_t used;
} BinaryColumn;

static void put_binary(BinaryColumn *col, Py_ssize_t i, const uint8_t *start, int64_t length)
{
    if (length >= 0) {
        if (col->valid != NULL)
            col->valid[i >> 3] |= (uint8_t)(1u << (i & 7));
        memcpy(col->data + col->used, start, (size_t)length);
        col->used += (int32_t)length;
    }
    col->offsets[i + 1] = col->used;
}

typedef struct { /* one batch's records section and what its records are relative to */
    Py_buffer body;
    Py_ssize_t record_count;
    long long base_offset, base_timestamp, append_time;
} BatchBody;

/* Parses the (body, record_count, base_offset, base_timestamp, append_time) tuples and
   walks each body with scan_records' checks. Returns the number parsed (whose buffers the
   caller releases) and sets *failed on an error (a Python exception is set). */
static Py_ssize_t take_batches(PyObject *seq, BatchBody *batches, Py_ssize_t count, int *failed)
{
    *failed = 1;
    for (Py_ssize_t b = 0; b < count; b++) {
        BatchBody *batch = &batches[b];
        PyObject *item = PyTuple_GET_ITEM(seq, b);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "decode_columns: batch %zd is a %.100s, not a tuple", b, Py_TYPE(item)->tp_name);
            return b;
        }
        if (!PyArg_ParseTuple(item, "y*nLLL:decode_columns batch", &batch->body,
                              &batch->record_count, &batch->base_offset, &batch->base_timestamp, &batch->append_time))
            return b;
        if (hold_immutable(&batch->body) < 0)
            return b; /* released */
        Cursor c = {.buf = (const uint8_t *)batch->body.buf, .end = batch->body.len, .pos = 0};
        int64_t max_timestamp_delta;
        if (batch->record_count < 0)
            snprintf(c.message, sizeof c.message, "record count %zd", batch->record_count);
        if (batch->record_count < 0 || scan_body(&c, batch->record_count, 0, &max_timestamp_delta) < 0) {
            PyErr_Format(PyExc_ValueError, "batch at offset %lld: %s", batch->base_offset, c.message);
            return b + 1;
        }
    }
    *failed = 0;
    return count;
}

typedef struct { /* the byte sizes of the variable-length columns */
    int64_t records, keys, values, headers, header_keys, header_values;
} ColumnSizes;

static void measure_body(const BatchBody *batch, ColumnSizes *sizes)
{
    Cursor c = {.buf = (const uint8_t *)batch->body.buf, .end = batch->body.len, .pos = 0};
    const uint8_t *start;
    int64_t skip, length, count;
    sizes->records += batch->record_count;
    for (Py_ssize_t i = 0; i < batch->record_count; i++) {
        read_varint(&c, &skip);
        c.pos += 1; /* attributes */
        read_varint(&c, &skip);
        read_varint(&c, &skip);
        if ((length = next_field(&c, &start)) > 0)
            sizes->keys += length;
        if ((length = next_field(&c, &start)) > 0)
            sizes->values += length;
        read_varint(&c, &count);
        sizes->headers += count;
        for (int64_t h = 0; h < count; h++) {
            sizes->header_keys += next_field(&c, &start);
            if ((length = next_field(&c, &start)) > 0)
                sizes->header_values += length;
        }
    }
}

typedef struct { /* the columns being filled, and the next record and header to write */
    int64_t *offsets, *timestamps;
    BinaryColumn keys, values;
    int32_t *header_offsets;
    BinaryColumn header_keys, header_values;
    Py_ssize_t record, header;
} Columns;

static void fill_body(const BatchBody *batch, Columns *out)
{
    Cursor c = {.buf = (const uint8_t *)batch->body.buf, .end = batch->body.len, .pos = 0};
    const uint8_t *start;
    int64_t skip, length, count, timestamp_delta, offset_delta;
    for (Py_ssize_t i = 0; i < batch->record_count; i++, out->record++) {
        Py_ssize_t r = out->record;
        read_varint(&c, &skip);
        c.pos += 1;
        read_varint(&c, &timestamp_delta);
        read_varint(&c, &offset_delta);
        out->offsets[r] = batch->base_offset + offset_delta;
        out->timestamps[r] = batch->append_time >= 0 ? batch->append_time : batch->base_timestamp + timestamp_delta;
        length = next_field(&c, &start);
        put_binary(&out->keys, r, start, length);
        length = next_field(&c, &start);
        put_binary(&out->values, r, start, length);
        read_varint(&c, &count);
        for (int64_t h = 0; h < count; h++, out->header++) {
            length = next_field(&c, &start);
            put_binary(&out->header_keys, out->header, start, length);
            length = next_field(&c, &start);
            put_binary(&out->header_values, out->header, start, length);
        }
        out->header_offsets[r + 1] = (int32_t)out->header;
    }
}

/* Below this many bytes of bodies the GIL stays: giving it up costs a wait to get it back
   when another thread runs Python, more than a small decode takes. */
#define RELEASE_GIL_MIN_BYTES (64 * 1024)

static PyObject *decode_columns(PyObject *module, PyObject *arg)
{
    (void)module;
    /* A tuple of its own: the caller's list could change while the batches are parsed. */
    PyObject *out = NULL, *seq = PySequence_Tuple(arg);
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(seq);
    BatchBody *batches = PyMem_Calloc((size_t)(count > 0 ? count : 1), sizeof(BatchBody));
    if (batches == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *columns_bytes[14] = {NULL};
    int failed;
    Py_ssize_t taken = take_batches(seq, batches, count, &failed);
    if (failed)
        goto done;
    /* Every body is bytes now (hold_immutable), and the passes below touch no Python
       object: a large decode gives up the GIL, so the consumer's receiving thread runs on. */
    Py_ssize_t body_bytes = 0;
    for (Py_ssize_t b = 0; b < count; b++)
        body_bytes += batches[b].body.len;
    int release = body_bytes >= RELEASE_GIL_MIN_BYTES;
    /* First pass: the sizes of the variable-length columns. */
    ColumnSizes total = {0};
    PyThreadState *released = release ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t b = 0; b < count; b++)
        measure_body(&batches[b], &total);
    if (released != NULL)
        PyEval_RestoreThread(released);
    if (total.keys > INT32_MAX || total.values > INT32_MAX || total.headers > INT32_MAX - 1 ||
        total.header_keys > INT32_MAX || total.header_values > INT32_MAX || total.records > INT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "a column of the batches passes Arrow's 2 GiB binary limit");
        goto done;
    }
    Py_ssize_t n = (Py_ssize_t)total.records, h_total = (Py_ssize_t)total.headers;
    Py_ssize_t sizes[14] = {
        8 * n, 8 * n,
        (n + 7) / 8, 4 * (n + 1), (Py_ssize_t)total.keys,
        (n + 7) / 8, 4 * (n + 1), (Py_ssize_t)total.values,
        4 * (n + 1),
        4 * (h_total + 1), (Py_ssize_t)total.header_keys,
        (h_total + 7) / 8, 4 * (h_total + 1), (Py_ssize_t)total.header_values,
    };
    char *buf[14];
    for (int k = 0; k < 14; k++) {
        if ((columns_bytes[k] = PyBytes_FromStringAndSize(NULL, sizes[k])) == NULL)
            goto done;
        buf[k] = PyBytes_AS_STRING(columns_bytes[k]);
        memset(buf[k], 0, (size_t)sizes[k]);
    }
    Columns columns = {
        .offsets = (int64_t *)buf[0],
        .timestamps = (int64_t *)buf[1],
        .keys = {(uint8_t *)buf[2], (int32_t *)buf[3], buf[4], 0},
        .values = {(uint8_t *)buf[5], (int32_t *)buf[6], buf[7], 0},
        .header_offsets = (int32_t *)buf[8],
        .header_keys = {NULL, (int32_t *)buf[9], buf[10], 0},
        .header_values = {(uint8_t *)buf[11], (int32_t *)buf[12], buf[13], 0},
    };
    /* Second pass: fill them. The bytes objects are this call's alone (untracked by the
       collector, in no container yet) until the tuple below takes them. */
    released = release ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t b = 0; b < count; b++)
        fill_body(&batches[b], &columns);
    if (released != NULL)
        PyEval_RestoreThread(released);
    if ((out = PyTuple_New(14)) == NULL)
        goto done;
    for (int k = 0; k < 14; k++) {
        PyTuple_SET_ITEM(out, k, columns_bytes[k]); /* stolen */
        columns_bytes[k] = NULL;
    }
done:
    for (int k = 0; k < 14; k++)
        Py_XDECREF(columns_bytes[k]);
    for (Py_ssize_t b = 0; b < taken; b++)
        PyBuffer_Release(&batches[b].body);
    PyMem_Free(batches);
    Py_DECREF(seq);
    return out;
}

/* ------------------------------------------------------------------ encode */

static PyObject *attr_key, *attr_value, *attr_headers, *attr_timestamp_ms; /* interned at import */

/* A nullable bytes field: a view of the bytes-like object, or len -1 for None. */
typedef struct {
    Py_buffer view;
    Py_ssize_t len;
} Field;

static int field_open(Field *f, PyObject *obj, const char *what)
{
    f->len = -1;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, &f->view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "a record %s must be bytes or None, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    f->len = f->view.len;
    return 0;
}

static void field_close(Field *f)
{
    if (f->len >= 0)
        PyBuffer_Release(&f->view);
    f->len = -1;
}

static Py_ssize_t field_size(const Field *f)
{
    return f->len < 0 ? 1 : varint_size(f->len) + f->len;
}

static void put_field(Out *o, const Field *f)
{
    put_varint(o, f->len);
    if (f->len > 0) {
        memcpy(o->data + o->len, f->view.buf, (size_t)f->len);
        o->len += f->len;
    }
}

/* A field of a record: item `index` of a (value, key, headers, timestamp_ms) tuple (a
   SimpleRecord is one), else the attribute. A new reference, or NULL with an error set. */
static PyObject *record_field(PyObject *record, Py_ssize_t index, PyObject *attr)
{
    if (PyTuple_Check(record)) {
        if (PyTuple_GET_SIZE(record) != 4) {
            PyErr_SetString(PyExc_TypeError, "a record tuple is (value, key, headers, timestamp_ms)");
            return NULL;
        }
        PyObject *item = PyTuple_GET_ITEM(record, index);
        Py_INCREF(item);
        return item;
    }
    return PyObject_GetAttr(record, attr);
}

static int timestamp_of(PyObject *record, int64_t now_ms, int64_t *out)
{
    PyObject *ts = record_field(record, 3, attr_timestamp_ms);
    if (ts == NULL)
        return -1;
    if (ts == Py_None) {
        *out = now_ms;
    } else {
        long long v = PyLong_AsLongLong(ts);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(ts);
            return -1;
        }
        *out = v;
    }
    Py_DECREF(ts);
    return 0;
}

/* Appends one record: length varint, then attributes, deltas, key, value, headers. */
static int encode_one(Out *o, PyObject *record, int64_t offset_delta, int64_t timestamp_delta)
{
    int result = -1;
    Field key = {.len = -1}, value = {.len = -1};
    PyObject *key_obj = NULL, *value_obj = NULL, *headers_obj = NULL, *headers = NULL;
    Py_ssize_t header_count = 0;
    Field *header_values = NULL;
    const char **header_keys = NULL;
    Py_ssize_t *header_key_lens = NULL;

    if ((key_obj = record_field(record, 1, attr_key)) == NULL || field_open(&key, key_obj, "key") < 0)
        goto done;
    if ((value_obj = record_field(record, 0, attr_value)) == NULL || field_open(&value, value_obj, "value") < 0)
        goto done;
    if ((headers_obj = record_field(record, 2, attr_headers)) == NULL)
        goto done;
    if ((headers = PySequence_Fast(headers_obj, "record headers must be a sequence of (str, bytes | None)")) == NULL)
        goto done;
    header_count = PySequence_Fast_GET_SIZE(headers);
    Py_ssize_t size = 1 + varint_size(timestamp_delta) + varint_size(offset_delta) + field_size(&key) +
                      field_size(&value) + varint_size(header_count);
    if (header_count > 0) {
        header_values = PyMem_Calloc((size_t)header_count, sizeof(Field));
        header_keys = PyMem_Calloc((size_t)header_count, sizeof(char *));
        header_key_lens = PyMem_Calloc((size_t)header_count, sizeof(Py_ssize_t));
        if (header_values == NULL || header_keys == NULL || header_key_lens == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t h = 0; h < header_count; h++)
            header_values[h].len = -1;
        for (Py_ssize_t h = 0; h < header_count; h++) {
            PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(headers, h), "a record header must be a (str, bytes | None) pair");
            if (pair == NULL)
                goto done;
            if (PySequence_Fast_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "a record header must be a (str, bytes | None) pair");
                Py_DECREF(pair);
                goto done;
            }
            PyObject *k = PySequence_Fast_GET_ITEM(pair, 0);
            if (!PyUnicode_Check(k)) {
                PyErr_Format(PyExc_TypeError, "a record header key must be str, not %.100s", Py_TYPE(k)->tp_name);
                Py_DECREF(pair);
                goto done;
            }
            /* The UTF-8 form is cached on the str, which the record keeps alive. */
            header_keys[h] = PyUnicode_AsUTF8AndSize(k, &header_key_lens[h]);
            int failed = header_keys[h] == NULL ||
                         field_open(&header_values[h], PySequence_Fast_GET_ITEM(pair, 1), "header value") < 0;
            Py_DECREF(pair);
            if (failed)
                goto done;
            size += varint_size(header_key_lens[h]) + header_key_lens[h] + field_size(&header_values[h]);
        }
    }
    if (out_reserve(o, varint_size(size) + size) < 0)
        goto done;
    Py_ssize_t start = o->len;
    put_varint(o, size);
    Py_ssize_t body_start = o->len;
    o->data[o->len++] = 0; /* attributes: unused */
    put_varint(o, timestamp_delta);
    put_varint(o, offset_delta);
    put_field(o, &key);
    put_field(o, &value);
    put_varint(o, header_count);
    for (Py_ssize_t h = 0; h < header_count; h++) {
        put_varint(o, header_key_lens[h]);
        memcpy(o->data + o->len, header_keys[h], (size_t)header_key_lens[h]);
        o->len += header_key_lens[h];
        put_field(o, &header_values[h]);
    }
    assert(o->len - body_start == size);
    (void)start;
    result = 0;
done:
    field_close(&key);
    field_close(&value);
    if (header_values != NULL) {
        for (Py_ssize_t h = 0; h < header_count; h++)
            field_close(&header_values[h]);
    }
    PyMem_Free(header_values);
    PyMem_Free(header_keys);
    PyMem_Free(header_key_lens);
    Py_XDECREF(key_obj);
    Py_XDECREF(value_obj);
    Py_XDECREF(headers_obj);
    Py_XDECREF(headers);
    return result;
}

static PyObject *encode_records(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *records_obj, *records = NULL, *result = NULL;
    long long now_ms;
    Out o = {NULL, 0, 0};
    if (!PyArg_ParseTuple(args, "OL:encode_records", &records_obj, &now_ms))
        return NULL;
    if ((records = PySequence_Fast(records_obj, "records must be a sequence")) == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(records);
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "a record batch needs at least one record");
        goto done;
    }
    int64_t base = 0, max_timestamp = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ts, delta;
        if (timestamp_of(PySequence_Fast_GET_ITEM(records, i), now_ms, &ts) < 0)
            goto done;
        if (i == 0)
            base = max_timestamp = ts;
        else if (ts > max_timestamp)
            max_timestamp = ts;
        if (__builtin_sub_overflow(ts, base, &delta)) {
            PyErr_Format(PyExc_ValueError, "varint out of int64 range: %lld - %lld", (long long)ts, (long long)base);
            goto done;
        }
        if (encode_one(&o, PySequence_Fast_GET_ITEM(records, i), i, delta) < 0)
            goto done;
    }
    PyObject *body = PyBytes_FromStringAndSize(o.data, o.len);
    if (body != NULL)
        result = Py_BuildValue("(NLL)", body, (long long)base, (long long)max_timestamp);
done:
    PyMem_Free(o.data);
    Py_DECREF(records);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(body, record_count) -> largest timestamp delta or None; ValueError if malformed."},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(body, record_count, base_offset, base_timestamp, append_time) -> [(offset, timestamp, key,"
     " value, headers)]; the checks and ValueError of scan_records. append_time >= 0: every timestamp is it."},
    {"decode_consumer_records", decode_consumer_records, METH_VARARGS,
     "decode_consumer_records(body, record_count, base_offset, base_timestamp, append_time, record_type, topic,"
     " partition, timestamp_type, start_offset) -> [record_type(topic, partition, offset, timestamp, timestamp_type,"
     " key, value, headers, key size, value size)] for the records at start_offset or later; decode_records' checks."},
    {"decode_columns", decode_columns, METH_O,
     "decode_columns(batches) -> 14 bytes buffers in Arrow's layouts for the records of all the (body, record_count,"
     " base_offset, base_timestamp, append_time) batches (see the module's comment); scan_records' checks per batch."},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(records, now_ms) -> (records section of a v2 batch, base timestamp, max timestamp)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_records", "The compiled halves of rayk.storage.records.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void)
{
    attr_key = PyUnicode_InternFromString("key");
    attr_value = PyUnicode_InternFromString("value");
    attr_headers = PyUnicode_InternFromString("headers");
    attr_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    if (attr_key == NULL || attr_value == NULL || attr_headers == NULL || attr_timestamp_ms == NULL)
        return NULL;
    return PyModule_Create(&module);
}
