/* Producer.send's common case, compiled: a record of bytes appended to its partition's
   open batch with no Python frame. py-spy on a driver sending 1 M records put ~60% of its
   thread in Producer.send and RecordAccumulator.append: each a frame, the accumulator's
   lock taken by a `with`, a dozen attribute reads and writes, the record's callback
   queued by a method call. rayk.client.send_path.send_path_reference is the same in
   Python, the reference the tests hold this to.

   SendPath(accumulator, metadata, plain_keys, plain_values, max_record_bytes)
   path(producer, topic, value, key, headers, partition, timestamp_ms, callback)
       -> FutureRecordMetadata, or None

   Appends the record and returns its future only where Producer.send, given the same
   arguments, would append it to the open batch of its partition without closing or
   opening a batch, waiting, raising or choosing a partition at random:
   - the producer is not closed (`producer._closed` is False), the accumulator neither
     (`closed` False, `_failure` None), and no other thread holds its lock (`_mutex`,
     taken without waiting and held throughout);
   - `topic` is a str whose partition count the metadata knows (`metadata._topics`);
   - `value` is bytes and `key` None or bytes, with no serializer of their own
     (`plain_values`, `plain_keys`), `headers` None, and the record's size at most
     `max_record_bytes`;
   - the partition is `partition` (an int in range), or the key's (murmur2), or, with
     neither, the topic's sticky partition (`accumulator._partitioner._sticky_by_topic`);
   - the buffer has room (`_buffered_bytes` + size <= `_buffer_memory`) and the
     partition's open batch stays under `_batch_size` with the record in it.
   `timestamp_ms` is None, or an int (0: now, as `timestamp_ms or now` in Python).
   Otherwise it returns None having changed nothing, and Producer.send goes the Python
   way, which raises, waits or opens a batch as it always did.

   The record, its size and its callback go where RecordAccumulator.append puts them:
   (value, key, (), timestamp_ms) onto `batch.records`, `(callback, (index,
   timestamp_ms))` onto `batch.result._record_callbacks`, the counts and sizes of the
   batch and the accumulator moved on. Nothing between taking the lock and releasing it
   runs Python code (the collector is off meanwhile: an allocation could run a
   collection, and with it finalizers or gc.callbacks, on this thread with the lock held),
   so no other thread sees the batch half-appended and no send() nests in another.

   RecordPlace(batch, index, timestamp_ms): the base of FutureRecordMetadata, its three
   slots (`_batch`, `_index`, `_timestamp_ms`, read-only) made without a Python __init__:
   send() makes one per record, and the sender thread one per record with a callback. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../storage/_murmur2.h"
#include "structmember.h"

#define RECORD_OVERHEAD_BYTES 21 /* rayk.client.send_path.RECORD_OVERHEAD_BYTES */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *accumulator;
    PyObject *mutex;       /* accumulator._mutex, an RLock */
    PyObject *open;        /* accumulator._open: (topic, partition) -> ProducerBatch */
    PyObject *sticky;      /* accumulator._partitioner._sticky_by_topic: topic -> partition */
    PyObject *metadata;    /* its _topics: topic -> {partition: leader} */
    PyObject *future_type; /* rayk.client.produce_future.FutureRecordMetadata */
    int future_is_place;   /* a RecordPlace adding no state: made by tp_alloc and three stores */
    PyObject *last_tp;     /* the last (topic, partition) looked up, and its hash: records come in runs */
    Py_hash_t last_tp_hash;
    int plain_keys, plain_values;
    Py_ssize_t max_record_bytes, batch_size, buffer_memory;
} SendPath;

static PyObject *str_producer_closed, *str_closed, *str_failure, *str_buffered_bytes, *str_unfinished,
    *str_topics, *str_size_bytes, *str_record_count, *str_records, *str_result, *str_record_callbacks, *str_extend,
    *str_acquire, *str_release, *empty_tuple;

/* An attribute that must be a Python int fitting a Py_ssize_t; -1 with an error set otherwise. */
static Py_ssize_t ssize_attr(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    Py_ssize_t n = PyLong_Check(value) ? PyLong_AsSsize_t(value) : -1;
    if (n < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "%R is not a count", name);
    Py_DECREF(value);
    return n;
}

static Py_ssize_t ssize_attr_named(PyObject *obj, const char *name)
{
    PyObject *name_obj = PyUnicode_FromString(name);
    if (name_obj == NULL)
        return -1;
    Py_ssize_t n = ssize_attr(obj, name_obj);
    Py_DECREF(name_obj);
    return n;
}

/* ------------------------------------------------------------------ RecordPlace */

typedef struct {
    PyObject_HEAD
    PyObject *batch, *index, *timestamp_ms;
} RecordPlace;

static PyObject *record_place_make(PyTypeObject *type, PyObject *batch, PyObject *index, PyObject *timestamp_ms)
{
    RecordPlace *self = (RecordPlace *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->batch = Py_NewRef(batch);
    self->index = Py_NewRef(index);
    self->timestamp_ms = Py_NewRef(timestamp_ms);
    return (PyObject *)self;
}

static PyObject *RecordPlace_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"batch", "index", "timestamp_ms", NULL};
    PyObject *batch, *index, *timestamp_ms;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:FutureRecordMetadata", kwlist, &batch, &index, &timestamp_ms))
        return NULL;
    return record_place_make(type, batch, index, timestamp_ms);
}

static int RecordPlace_traverse(RecordPlace *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    Py_VISIT(self->index);
    Py_VISIT(self->timestamp_ms);
    return 0;
}

static int RecordPlace_clear(RecordPlace *self)
{
    Py_CLEAR(self->batch);
    Py_CLEAR(self->index);
    Py_CLEAR(self->timestamp_ms);
    return 0;
}

static void RecordPlace_dealloc(RecordPlace *self)
{
    /* FutureRecordMetadata's dealloc (subtype_dealloc) untracks it first and drops the
       reference to its class after this. */
    PyObject_GC_UnTrack(self);
    RecordPlace_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef RecordPlace_members[] = {
    {"_batch", T_OBJECT_EX, offsetof(RecordPlace, batch), READONLY, "the record's BatchResult"},
    {"_index", T_OBJECT_EX, offsetof(RecordPlace, index), READONLY, "the record's index in its batch"},
    {"_timestamp_ms", T_OBJECT_EX, offsetof(RecordPlace, timestamp_ms), READONLY, "the record's create time"},
    {NULL},
};

static PyTypeObject RecordPlaceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rayk.client._send.RecordPlace",
    .tp_doc = "A record's place in its batch: the base of FutureRecordMetadata (see rayk/client/_send.c).",
    .tp_basicsize = sizeof(RecordPlace),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = RecordPlace_new,
    .tp_traverse = (traverseproc)RecordPlace_traverse,
    .tp_clear = (inquiry)RecordPlace_clear,
    .tp_dealloc = (destructor)RecordPlace_dealloc,
    .tp_members = RecordPlace_members,
};

/* ------------------------------------------------------------------ SendPath */

static int SendPath_init(SendPath *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"accumulator", "metadata", "plain_keys", "plain_values", "max_record_bytes", NULL};
    PyObject *accumulator, *metadata;
    int plain_keys, plain_values;
    Py_ssize_t max_record_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOppn:SendPath", kwlist, &accumulator, &metadata, &plain_keys,
                                     &plain_values, &max_record_bytes))
        return -1;
    /* Read once: the accumulator never replaces these (abort() clears _open in place). */
    PyObject *mutex = NULL, *open = NULL, *partitioner = NULL, *sticky = NULL, *module = NULL, *future_type = NULL;
    Py_ssize_t batch_size = -1, buffer_memory = -1;
    if ((mutex = PyObject_GetAttrString(accumulator, "_mutex")) == NULL ||
        (open = PyObject_GetAttrString(accumulator, "_open")) == NULL ||
        (partitioner = PyObject_GetAttrString(accumulator, "_partitioner")) == NULL ||
        (sticky = PyObject_GetAttrString(partitioner, "_sticky_by_topic")) == NULL ||
        (module = PyImport_ImportModule("rayk.client.produce_future")) == NULL ||
        (future_type = PyObject_GetAttrString(module, "FutureRecordMetadata")) == NULL ||
        (batch_size = ssize_attr_named(accumulator, "_batch_size")) < 0 ||
        (buffer_memory = ssize_attr_named(accumulator, "_buffer_memory")) < 0 || !PyDict_CheckExact(open) ||
        !PyDict_CheckExact(sticky)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "SendPath: the accumulator's _open and sticky partitions must be dicts");
        Py_XDECREF(mutex), Py_XDECREF(open), Py_XDECREF(partitioner), Py_XDECREF(sticky), Py_XDECREF(module);
        Py_XDECREF(future_type);
        return -1;
    }
    Py_DECREF(partitioner);
    Py_DECREF(module);
    Py_INCREF(accumulator);
    Py_INCREF(metadata);
    Py_XSETREF(self->accumulator, accumulator);
    Py_XSETREF(self->metadata, metadata);
    Py_XSETREF(self->mutex, mutex);
    Py_XSETREF(self->open, open);
    Py_XSETREF(self->sticky, sticky);
    Py_XSETREF(self->future_type, future_type);
    /* FutureRecordMetadata adds methods to RecordPlace, no state and no __new__ or
       __init__ of its own: made here directly, as calling it would make it. */
    PyTypeObject *future_as_type = PyType_Check(future_type) ? (PyTypeObject *)future_type : NULL;
    self->future_is_place = future_as_type != NULL && PyType_IsSubtype(future_as_type, &RecordPlaceType) &&
                            future_as_type->tp_basicsize == RecordPlaceType.tp_basicsize &&
                            future_as_type->tp_new == RecordPlaceType.tp_new &&
                            future_as_type->tp_init == RecordPlaceType.tp_init;
    Py_CLEAR(self->last_tp);
    self->plain_keys = plain_keys;
    self->plain_values = plain_values;
    self->max_record_bytes = max_record_bytes;
    self->batch_size = batch_size;
    self->buffer_memory = buffer_memory;
    return 0;
}

static int SendPath_traverse(SendPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->accumulator);
    Py_VISIT(self->mutex);
    Py_VISIT(self->open);
    Py_VISIT(self->sticky);
    Py_VISIT(self->metadata);
    Py_VISIT(self->future_type);
    Py_VISIT(self->last_tp);
    return 0;
}

static int SendPath_clear(SendPath *self)
{
    Py_CLEAR(self->accumulator);
    Py_CLEAR(self->mutex);
    Py_CLEAR(self->open);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->metadata);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->last_tp);
    return 0;
}

static void SendPath_dealloc(SendPath *self)
{
    PyObject_GC_UnTrack(self);
    SendPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns()'s clock */
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The appending half, the lock held and the collector off: 1 appended (*result_out and
   *index_out set to the batch's result and the record's index, new references), 0 not this
   way (nothing changed), -1 error (nothing changed). */
static int append_locked(SendPath *self, PyObject *topic, PyObject *value, PyObject *key, PyObject *partition_obj,
                         Py_ssize_t partition, Py_ssize_t num_partitions, Py_ssize_t size, PyObject *timestamp,
                         PyObject *callback, PyObject **result_out, PyObject **index_out)
{
    PyObject *acc = self->accumulator;
    PyObject *failure = PyObject_GetAttr(acc, str_failure);
    if (failure == NULL)
        return -1;
    Py_DECREF(failure);
    if (failure != Py_None)
        return 0;
    PyObject *closed = PyObject_GetAttr(acc, str_closed);
    if (closed == NULL)
        return -1;
    Py_DECREF(closed);
    if (closed != Py_False)
        return 0;
    Py_ssize_t buffered = ssize_attr(acc, str_buffered_bytes);
    if (buffered < 0)
        return -1;
    if (buffered + size > self->buffer_memory)
        return 0; /* append waits for room */
    int rc = -1;
    PyObject *batch = NULL, *records = NULL, *result = NULL, *record = NULL, *queue = NULL, *pair = NULL,
             *place = NULL, *index_obj = NULL, *count_obj = NULL, *bytes_obj = NULL, *unfinished_obj = NULL,
             *buffered_obj = NULL;
    Py_INCREF(partition_obj);
    if (partition < 0) { /* unkeyed: the sticky partition, if the topic has one in range */
        PyObject *sticky = PyDict_GetItemWithError(self->sticky, topic);
        if (sticky == NULL) {
            rc = PyErr_Occurred() ? -1 : 0; /* the first pick is random: Python's */
            goto done;
        }
        rc = 0;
        if (!PyLong_CheckExact(sticky))
            goto done;
        partition = PyLong_AsSsize_t(sticky);
        if (partition == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* not a partition of any topic: the partitioner picks another */
            goto done;
        }
        if (partition < 0 || partition >= num_partitions)
            goto done;
        Py_SETREF(partition_obj, Py_NewRef(sticky));
        rc = -1;
    }
    PyObject *tp = self->last_tp; /* the dict's key, (topic, partition), made again only for another one */
    if (tp == NULL || PyTuple_GET_ITEM(tp, 0) != topic || PyLong_AsSsize_t(PyTuple_GET_ITEM(tp, 1)) != partition) {
        tp = PyTuple_Pack(2, topic, partition_obj);
        Py_hash_t hash = tp ? PyObject_Hash(tp) : -1;
        if (hash == -1) {
            Py_XDECREF(tp);
            goto done;
        }
        Py_XSETREF(self->last_tp, tp);
        self->last_tp_hash = hash;
    }
    batch = Py_XNewRef(_PyDict_GetItem_KnownHash(self->open, tp, self->last_tp_hash));
    if (batch == NULL) {
        rc = PyErr_Occurred() ? -1 : 0; /* no open batch: append opens one */
        goto done;
    }
    Py_ssize_t batch_bytes = ssize_attr(batch, str_size_bytes);
    if (batch_bytes < 0)
        goto done;
    if (batch_bytes + size >= self->batch_size) {
        rc = 0; /* append closes the batch, before or after the record */
        goto done;
    }
    Py_ssize_t index = ssize_attr(batch, str_record_count);
    Py_ssize_t unfinished = ssize_attr(acc, str_unfinished);
    if (index < 0 || unfinished < 0)
        goto done;
    records = PyObject_GetAttr(batch, str_records);
    result = PyObject_GetAttr(batch, str_result);
    if (records == NULL || result == NULL)
        goto done;
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "SendPath: a batch's records must be a list");
        goto done;
    }
    /* Everything the append needs is made before anything changes. The record and its
       place hold bytes, None and ints only: no cycle can go through them, so the collector
       need not walk them (it would untrack them at its first look, as it does any such
       tuple; they live until the batch is acknowledged). */
    index_obj = PyLong_FromSsize_t(index);
    count_obj = PyLong_FromSsize_t(index + 1);
    bytes_obj = PyLong_FromSsize_t(batch_bytes + size);
    unfinished_obj = PyLong_FromSsize_t(unfinished + 1);
    buffered_obj = PyLong_FromSsize_t(buffered + size);
    record = PyTuple_Pack(4, value, key, empty_tuple, timestamp);
    if (index_obj == NULL || count_obj == NULL || bytes_obj == NULL || unfinished_obj == NULL ||
        buffered_obj == NULL || record == NULL)
        goto done;
    PyObject_GC_UnTrack(record);
    if (callback != Py_None) {
        queue = PyObject_GetAttr(result, str_record_callbacks);
        place = queue ? PyTuple_Pack(2, index_obj, timestamp) : NULL;
        if (place == NULL)
            goto done;
        PyObject_GC_UnTrack(place);
        pair = PyTuple_Pack(2, callback, place);
        if (pair == NULL)
            goto done;
    }
    /* The changes: the record, its callback, then the counts (stores that cannot fail). */
    if (PyList_Append(records, record) < 0)
        goto done;
    if (pair != NULL) {
        PyObject *queued = PyObject_CallMethodOneArg(queue, str_extend, pair); /* deque.extend */
        if (queued == NULL) { /* out of memory: take the record back out */
            PyList_SetSlice(records, PyList_GET_SIZE(records) - 1, PyList_GET_SIZE(records), NULL);
            goto done;
        }
        Py_DECREF(queued);
    }
    if (PyObject_SetAttr(batch, str_record_count, count_obj) < 0 || PyObject_SetAttr(batch, str_size_bytes, bytes_obj) < 0 ||
        PyObject_SetAttr(acc, str_unfinished, unfinished_obj) < 0 ||
        PyObject_SetAttr(acc, str_buffered_bytes, buffered_obj) < 0)
        goto done;
    *result_out = result;
    result = NULL;
    *index_out = index_obj;
    index_obj = NULL;
    rc = 1;
done:
    Py_DECREF(partition_obj);
    Py_XDECREF(batch);
    Py_XDECREF(records);
    Py_XDECREF(result);
    Py_XDECREF(record);
    Py_XDECREF(queue);
    Py_XDECREF(place);
    Py_XDECREF(pair);
    Py_XDECREF(index_obj);
    Py_XDECREF(count_obj);
    Py_XDECREF(bytes_obj);
    Py_XDECREF(unfinished_obj);
    Py_XDECREF(buffered_obj);
    return rc;
}

static PyObject *SendPath_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SendPath *self = (SendPath *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "SendPath(producer, topic, value, key, headers, partition, timestamp_ms, callback)");
        return NULL;
    }
    if (self->accumulator == NULL) {
        PyErr_SetString(PyExc_ValueError, "SendPath is not initialised");
        return NULL;
    }
    PyObject *producer = args[0], *topic = args[1], *value = args[2], *key = args[3], *headers = args[4],
             *partition_obj = args[5], *timestamp_obj = args[6], *callback = args[7];
    if (!self->plain_values || !PyBytes_CheckExact(value) || headers != Py_None || !PyUnicode_CheckExact(topic))
        Py_RETURN_NONE;
    if (key != Py_None && (!self->plain_keys || !PyBytes_CheckExact(key)))
        Py_RETURN_NONE;
    PyObject *closed = PyObject_GetAttr(producer, str_producer_closed);
    if (closed == NULL)
        return NULL;
    Py_DECREF(closed);
    if (closed != Py_False)
        Py_RETURN_NONE;
    Py_ssize_t size = RECORD_OVERHEAD_BYTES + PyBytes_GET_SIZE(value) + (key != Py_None ? PyBytes_GET_SIZE(key) : 0);
    if (size > self->max_record_bytes)
        Py_RETURN_NONE;
    /* The partition count (MetadataCache.cached_partition_count). */
    PyObject *topics = PyObject_GetAttr(self->metadata, str_topics);
    if (topics == NULL)
        return NULL;
    if (!PyDict_Check(topics)) {
        Py_DECREF(topics);
        Py_RETURN_NONE;
    }
    PyObject *known = PyDict_GetItemWithError(topics, topic);
    Py_ssize_t num_partitions = known != NULL && PyDict_Check(known) ? PyDict_GET_SIZE(known) : 0;
    Py_DECREF(topics);
    if (PyErr_Occurred())
        return NULL;
    if (num_partitions < 1)
        Py_RETURN_NONE; /* not known yet: send looks it up, and waits */
    /* The partition: given, the key's, or (-1, partition_ref None) the sticky one, read under the lock. */
    Py_ssize_t partition;
    PyObject *partition_ref = NULL;
    if (partition_obj != Py_None) {
        if (!PyLong_CheckExact(partition_obj))
            Py_RETURN_NONE;
        partition = PyLong_AsSsize_t(partition_obj);
        if (partition == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_NONE; /* out of any range: send says so */
        }
        if (partition < 0 || partition >= num_partitions)
            Py_RETURN_NONE;
        partition_ref = Py_NewRef(partition_obj);
    } else if (key != Py_None) {
        partition = murmur2_partition((const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), num_partitions);
        partition_ref = PyLong_FromSsize_t(partition);
    } else {
        partition = -1;
        partition_ref = Py_NewRef(Py_None);
    }
    if (partition_ref == NULL)
        return NULL;
    /* The timestamp: `timestamp_ms or now`. */
    PyObject *timestamp;
    if (timestamp_obj == Py_None) {
        timestamp = PyLong_FromLongLong(now_ms());
    } else if (PyLong_CheckExact(timestamp_obj)) {
        int zero = PyObject_Not(timestamp_obj);
        timestamp = zero ? PyLong_FromLongLong(now_ms()) : Py_NewRef(timestamp_obj);
    } else {
        Py_DECREF(partition_ref);
        Py_RETURN_NONE;
    }
    if (timestamp == NULL) {
        Py_DECREF(partition_ref);
        return NULL;
    }
    /* The accumulator's lock, if no other thread holds it, with the collector off while
       it is held: an allocation could otherwise run a collection here, and with it
       finalizers and gc.callbacks, on this thread with the lock held (an RLock: a send()
       from one of them would append in the middle of this one). */
    int collector_was_on = PyGC_Disable();
    PyObject *acquire_args[2] = {self->mutex, Py_False};
    PyObject *acquired = PyObject_VectorcallMethod(str_acquire, acquire_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    PyObject *result = NULL, *index = NULL;
    int rc = acquired == NULL ? -1 : 0;
    if (acquired == Py_True) {
        rc = append_locked(self, topic, value, key, partition_ref, partition, num_partitions, size, timestamp, callback,
                           &result, &index);
        PyObject *type = NULL, *exc = NULL, *tb = NULL;
        if (rc < 0)
            PyErr_Fetch(&type, &exc, &tb);
        PyObject *released = PyObject_CallMethodNoArgs(self->mutex, str_release);
        if (released == NULL) {
            Py_XDECREF(type), Py_XDECREF(exc), Py_XDECREF(tb);
            rc = -1;
        } else {
            Py_DECREF(released);
            if (rc < 0)
                PyErr_Restore(type, exc, tb);
        }
    }
    Py_XDECREF(acquired);
    if (collector_was_on)
        PyGC_Enable();
    Py_DECREF(partition_ref);
    PyObject *future = NULL;
    if (rc == 1 && self->future_is_place) {
        future = record_place_make((PyTypeObject *)self->future_type, result, index, timestamp);
    } else if (rc == 1) {
        PyObject *future_args[3] = {result, index, timestamp};
        future = PyObject_Vectorcall(self->future_type, future_args, 3, NULL);
    } else if (rc == 0) {
        future = Py_NewRef(Py_None);
    }
    Py_XDECREF(result);
    Py_XDECREF(index);
    Py_DECREF(timestamp);
    return future;
}

static PyObject *SendPath_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *SendPath_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)args, (void)kwds;
    SendPath *self = (SendPath *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->vectorcall = SendPath_vectorcall;
    return (PyObject *)self;
}

static PyTypeObject SendPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rayk.client._send.SendPath",
    .tp_doc = "Producer.send's common case in C; see rayk/client/_send.c.",
    .tp_basicsize = sizeof(SendPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = SendPath_new,
    .tp_init = (initproc)SendPath_init,
    .tp_traverse = (traverseproc)SendPath_traverse,
    .tp_clear = (inquiry)SendPath_clear,
    .tp_dealloc = (destructor)SendPath_dealloc,
    .tp_call = SendPath_call,
    .tp_vectorcall_offset = offsetof(SendPath, vectorcall),
};

static struct PyModuleDef send_module = {
    PyModuleDef_HEAD_INIT, "_send", "Producer.send's common case, compiled (see _send.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__send(void)
{
#define INTERN(var, text)                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(str_producer_closed, "_closed");
    INTERN(str_closed, "closed");
    INTERN(str_failure, "_failure");
    INTERN(str_buffered_bytes, "_buffered_bytes");
    INTERN(str_unfinished, "unfinished");
    INTERN(str_topics, "_topics");
    INTERN(str_size_bytes, "size_bytes");
    INTERN(str_record_count, "record_count");
    INTERN(str_records, "records");
    INTERN(str_result, "result");
    INTERN(str_record_callbacks, "_record_callbacks");
    INTERN(str_extend, "extend");
    INTERN(str_acquire, "acquire");
    INTERN(str_release, "release");
#undef INTERN
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    if (PyType_Ready(&SendPathType) < 0 || PyType_Ready(&RecordPlaceType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&send_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "SendPath", (PyObject *)&SendPathType) < 0 ||
        PyModule_AddObjectRef(module, "RecordPlace", (PyObject *)&RecordPlaceType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
