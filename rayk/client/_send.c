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
   (value, key, (), timestamp_ms) onto `batch.records`, the callback, index and
   timestamp_ms onto `batch.result._record_callbacks`, the counts and sizes of the
   batch and the accumulator moved on. Nothing between taking the lock and releasing it
   runs Python code (the collector is off meanwhile: an allocation could run a
   collection, and with it finalizers or gc.callbacks, on this thread with the lock held),
   so no other thread sees the batch half-appended and no send() nests in another.
   The path reads and writes those attributes where Python keeps them, found once by
   SendPath(): the accumulator's, a ProducerBatch's and a BatchResult's __slots__ (the
   offsets their member descriptors read). An accumulator, batch or result of another
   class, or a value of another type, and it declines. Looked up by name per record, they were a third of the
   path's time (perf: _PyType_Lookup, the dict lookups, the interning in SetAttr).

   SendMethod(wrapped): Producer.send itself, so that `producer.send(...)` runs no
   Python frame either (see SendMethod below). run_record_callbacks: the sender thread's
   loop over a finished batch's record callbacks. RecordPlace.exception: what each of those
   callbacks asks first. The three are the rest of a record's way through a producer's
   threads, which share one GIL: `benchmarks/client_bench.py`'s send() went from ~0.6x to
   ~0.8x of confluent-kafka against Tansu with them (the design note of 2026-12-03 has
   the figures).

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
    PyObject *acquire, *release; /* its bound methods */
    PyTypeObject *acc_type, *batch_type, *result_type; /* the accumulator's class, ProducerBatch, BatchResult: of __slots__ */
    Py_ssize_t acc_failure, acc_closed, acc_unfinished, acc_buffered_bytes; /* the accumulator's slots */
    Py_ssize_t batch_records, batch_result, batch_record_count, batch_size_bytes, result_record_callbacks; /* slots */
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

static PyObject *str_producer_closed, *str_topics,
    *str_acquire, *str_release, *empty_tuple, *deque_append;
static PyTypeObject *deque_type;

/* Where the accumulator's batches keep what the path reads and writes per record: the slot
   `name` of `type` (a class of __slots__), found once as the offset its member descriptor
   reads, so the path reads and writes it as that descriptor would, with no attribute
   lookup; -1 with an error if `name` is not such a slot. */
static Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && PyType_IsSubtype(type, PyDescr_TYPE(descr)) &&
        ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
        !(((PyMemberDescrObject *)descr)->d_member->flags & READONLY))
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "SendPath: %s.%s is not a slot", type->tp_name, name);
    Py_DECREF(descr);
    return offset;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* An int slot's value, or -1 (unset, not an int, or negative: the path declines). */
static Py_ssize_t slot_count(PyObject *obj, Py_ssize_t offset)
{
    PyObject *value = SLOT(obj, offset);
    if (value == NULL || !PyLong_CheckExact(value))
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(value);
    if (n == -1 && PyErr_Occurred())
        PyErr_Clear();
    return n;
}

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

/* FutureRecordMetadata.exception(timeout=None), compiled: what the record failed with, or
   None; waits for the batch first (BatchResult.wait, which raises KafkaTimeoutError).
   A callback per record asks it of the future it is given: two Python frames (this and
   BatchResult.error_of) per record on the sender thread otherwise. */
static PyObject *str_finished, *str_wait, *str_named, *str_error, *str_error_of, *str_timeout;

static PyObject *RecordPlace_exception(RecordPlace *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *timeout = Py_None;
    if (nargs + nkw > 1 || (nkw == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_timeout) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "exception() takes one argument, timeout");
        return NULL;
    }
    if (nargs + nkw == 1)
        timeout = args[0];
    PyObject *batch = self->batch;
    PyObject *finished = PyObject_GetAttr(batch, str_finished);
    if (finished == NULL)
        return NULL;
    Py_DECREF(finished);
    if (finished != Py_True) {
        PyObject *waited = PyObject_CallMethodOneArg(batch, str_wait, timeout);
        if (waited == NULL)
            return NULL;
        Py_DECREF(waited);
    }
    PyObject *named = PyObject_GetAttr(batch, str_named);
    if (named == NULL)
        return NULL;
    Py_DECREF(named);
    if (named == Py_None)
        return PyObject_GetAttr(batch, str_error);
    return PyObject_CallMethodOneArg(batch, str_error_of, self->index);
}

static PyMethodDef RecordPlace_methods[] = {
    {"exception", (PyCFunction)(void (*)(void))RecordPlace_exception, METH_FASTCALL | METH_KEYWORDS,
     "exception($self, /, timeout=None)\n--\n\n"
     "The record's error, or None; waits up to `timeout` s for its batch (KafkaTimeoutError)."},
    {NULL},
};

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
    .tp_methods = RecordPlace_methods,
};

/* ------------------------------------------------------------------ run_record_callbacks */

/* run_record_callbacks(result, queued, future_type, report): BatchResult._finish's loop
   over its records' callbacks, compiled. `queued` holds a callable, then its record's
   index and timestamp_ms, and so on; each callable is called with
   future_type(result, index, timestamp_ms) in turn. One that raises an Exception has it
   passed to report(exception) and the loop goes on; any other BaseException
   (KeyboardInterrupt...) stops it and propagates, as `except Exception` would let it. A
   batch of 10,000 records made a Python loop's turn, a tuple unpacking, a `next` and a
   future's argument parsing per record on the sender thread, which shares the GIL with
   the threads calling send(). */
static PyObject *run_record_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run_record_callbacks(result, queued, future_type, report)");
        return NULL;
    }
    PyObject *result = args[0], *future_type = args[2], *report = args[3];
    PyTypeObject *as_type = PyType_Check(future_type) ? (PyTypeObject *)future_type : NULL;
    int is_place = as_type != NULL && PyType_IsSubtype(as_type, &RecordPlaceType) &&
                   as_type->tp_basicsize == RecordPlaceType.tp_basicsize && as_type->tp_new == RecordPlaceType.tp_new &&
                   as_type->tp_init == RecordPlaceType.tp_init;
    PyObject *queued = PyObject_GetIter(args[1]);
    if (queued == NULL)
        return NULL;
    PyObject *fn;
    while ((fn = PyIter_Next(queued)) != NULL) {
        PyObject *index = PyIter_Next(queued), *timestamp_ms = index ? PyIter_Next(queued) : NULL;
        PyObject *future = NULL, *called = NULL;
        if (timestamp_ms == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "run_record_callbacks: a callable without its record's place");
            Py_DECREF(fn);
            Py_XDECREF(index);
            Py_DECREF(queued);
            return NULL;
        }
        if (is_place) {
            future = record_place_make(as_type, result, index, timestamp_ms);
        } else {
            PyObject *future_args[3] = {result, index, timestamp_ms};
            future = PyObject_Vectorcall(future_type, future_args, 3, NULL);
        }
        if (future != NULL)
            called = PyObject_CallOneArg(fn, future);
        Py_XDECREF(future);
        Py_DECREF(index);
        Py_DECREF(timestamp_ms);
        Py_DECREF(fn);
        if (called != NULL) {
            Py_DECREF(called);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_DECREF(queued);
            return NULL;
        }
        PyObject *error_type, *error, *traceback;
        PyErr_Fetch(&error_type, &error, &traceback);
        PyErr_NormalizeException(&error_type, &error, &traceback);
        if (traceback != NULL && error != NULL)
            PyException_SetTraceback(error, traceback);
        PyObject *reported = error == NULL ? NULL : PyObject_CallOneArg(report, error);
        Py_XDECREF(error_type), Py_XDECREF(error), Py_XDECREF(traceback);
        if (reported == NULL) {
            Py_DECREF(queued);
            return NULL;
        }
        Py_DECREF(reported);
    }
    Py_DECREF(queued);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef send_functions[] = {
    {"run_record_callbacks", (PyCFunction)(void (*)(void))run_record_callbacks, METH_FASTCALL,
     "run_record_callbacks(result, queued, future_type, report): BatchResult._finish's loop (see _send.c)."},
    {NULL},
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
    Py_CLEAR(module);
    /* What the path reads and writes per record, found once (see slot_offset): the
       accumulator's counters, its batches' and their results' fields, all in slots. */
    PyObject *acquire = NULL, *release = NULL, *batch_type = NULL, *result_type = NULL;
    Py_ssize_t offsets[9] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
    int ok = (acquire = PyObject_GetAttr(mutex, str_acquire)) != NULL &&
             (release = PyObject_GetAttr(mutex, str_release)) != NULL &&
             (module = PyImport_ImportModule("rayk.client.accumulator")) != NULL &&
             (batch_type = PyObject_GetAttrString(module, "ProducerBatch")) != NULL &&
             (result_type = PyObject_GetAttrString(module, "BatchResult")) != NULL;
    Py_XDECREF(module);
    if (ok && (!PyType_Check(batch_type) || !PyType_Check(result_type))) {
        PyErr_SetString(PyExc_TypeError, "SendPath: ProducerBatch and BatchResult must be classes");
        ok = 0;
    }
    const char *acc_slots[] = {"_failure", "closed", "unfinished", "_buffered_bytes"};
    const char *batch_slots[] = {"records", "result", "record_count", "size_bytes"};
    for (int i = 0; ok && i < 4; i++)
        ok = (offsets[i] = slot_offset(Py_TYPE(accumulator), acc_slots[i])) >= 0 &&
             (offsets[4 + i] = slot_offset((PyTypeObject *)batch_type, batch_slots[i])) >= 0;
    ok = ok && (offsets[8] = slot_offset((PyTypeObject *)result_type, "_record_callbacks")) >= 0;
    if (!ok) {
        Py_XDECREF(acquire), Py_XDECREF(release), Py_XDECREF(batch_type), Py_XDECREF(result_type);
        Py_DECREF(mutex), Py_DECREF(open), Py_DECREF(sticky), Py_DECREF(future_type);
        return -1;
    }
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->acc_type, (PyTypeObject *)Py_NewRef(Py_TYPE(accumulator)));
    Py_XSETREF(self->batch_type, (PyTypeObject *)batch_type);
    Py_XSETREF(self->result_type, (PyTypeObject *)result_type);
    self->acc_failure = offsets[0];
    self->acc_closed = offsets[1];
    self->acc_unfinished = offsets[2];
    self->acc_buffered_bytes = offsets[3];
    self->batch_records = offsets[4];
    self->batch_result = offsets[5];
    self->batch_record_count = offsets[6];
    self->batch_size_bytes = offsets[7];
    self->result_record_callbacks = offsets[8];
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
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->acc_type);
    Py_VISIT(self->batch_type);
    Py_VISIT(self->result_type);
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
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->acc_type);
    Py_CLEAR(self->batch_type);
    Py_CLEAR(self->result_type);
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

/* Appends the n items to the deque `queue`, all or none (-1 with the error set). */
static int queue_all(PyObject *queue, PyObject *const *items, int n)
{
    for (int i = 0; i < n; i++) {
        PyObject *args[2] = {queue, items[i]};
        PyObject *appended = PyObject_Vectorcall(deque_append, args, 2, NULL);
        if (appended == NULL) {
            PyObject *error_type, *error, *traceback;
            PyErr_Fetch(&error_type, &error, &traceback);
            for (int j = 0; j < i; j++)
                Py_XDECREF(PyObject_CallMethod(queue, "pop", NULL));
            PyErr_Restore(error_type, error, traceback);
            return -1;
        }
        Py_DECREF(appended);
    }
    return 0;
}

/* The appending half, the lock held and the collector off: 1 appended (*result_out and
   *index_out set to the batch's result and the record's index, new references), 0 not this
   way (nothing changed), -1 error (nothing changed). */
static int append_locked(SendPath *self, PyObject *topic, PyObject *value, PyObject *key, PyObject *partition_obj,
                         Py_ssize_t partition, Py_ssize_t num_partitions, Py_ssize_t size, PyObject *timestamp,
                         PyObject *callback, PyObject **result_out, PyObject **index_out)
{
    PyObject *acc = self->accumulator;
    if (!Py_IS_TYPE(acc, self->acc_type) || SLOT(acc, self->acc_failure) != Py_None ||
        SLOT(acc, self->acc_closed) != Py_False)
        return 0; /* failed, closed, or not an accumulator as this path knows it: Python's way */
    Py_ssize_t buffered = slot_count(acc, self->acc_buffered_bytes);
    if (buffered < 0 || buffered + size > self->buffer_memory)
        return 0; /* append waits for room */
    int rc = -1;
    PyObject *batch = NULL, *records = NULL, *result = NULL, *record = NULL, *queue = NULL, *index_obj = NULL, *count_obj = NULL, *bytes_obj = NULL, *unfinished_obj = NULL,
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
    rc = 0; /* from here, anything unexpected is Python's to handle */
    if (!Py_IS_TYPE(batch, self->batch_type))
        goto done;
    Py_ssize_t batch_bytes = slot_count(batch, self->batch_size_bytes);
    if (batch_bytes < 0 || batch_bytes + size >= self->batch_size)
        goto done; /* append closes the batch, before or after the record */
    Py_ssize_t index = slot_count(batch, self->batch_record_count);
    Py_ssize_t unfinished = slot_count(acc, self->acc_unfinished);
    records = Py_XNewRef(SLOT(batch, self->batch_records));
    result = Py_XNewRef(SLOT(batch, self->batch_result));
    if (index < 0 || unfinished < 0 || records == NULL || !PyList_CheckExact(records) || result == NULL ||
        !Py_IS_TYPE(result, self->result_type))
        goto done;
    if (callback != Py_None) {
        queue = Py_XNewRef(SLOT(result, self->result_record_callbacks));
        if (queue == NULL || !Py_IS_TYPE(queue, deque_type)) /* a subclass's append could run Python code */
            goto done;
    }
    rc = -1;
    /* Everything the append needs is made before anything changes. The record holds
       bytes, None and ints only: no cycle can go through it, so the collector need not
       walk it (it would untrack it at its first look, as it does any such tuple; it lives
       until the batch is acknowledged). */
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
    /* The changes: the record, its callback, index and timestamp, then the counts. No
       other thread runs between them: nothing here runs Python code or lets the GIL go
       (deque.append allocates no object the collector tracks). */
    if (PyList_Append(records, record) < 0)
        goto done;
    if (queue != NULL && queue_all(queue, (PyObject *[]){callback, index_obj, timestamp}, 3) < 0) {
        PyObject *error_type, *error, *traceback; /* out of memory: take the record back out */
        PyErr_Fetch(&error_type, &error, &traceback);
        PyList_SetSlice(records, PyList_GET_SIZE(records) - 1, PyList_GET_SIZE(records), NULL);
        PyErr_Restore(error_type, error, traceback);
        goto done;
    }
    /* Stores into slots, which cannot fail (each held an int: its decref runs no code). */
    Py_SETREF(SLOT(batch, self->batch_record_count), Py_NewRef(count_obj));
    Py_SETREF(SLOT(batch, self->batch_size_bytes), Py_NewRef(bytes_obj));
    Py_SETREF(SLOT(acc, self->acc_unfinished), Py_NewRef(unfinished_obj));
    Py_SETREF(SLOT(acc, self->acc_buffered_bytes), Py_NewRef(buffered_obj));
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
    Py_XDECREF(index_obj);
    Py_XDECREF(count_obj);
    Py_XDECREF(bytes_obj);
    Py_XDECREF(unfinished_obj);
    Py_XDECREF(buffered_obj);
    return rc;
}

/* The path itself: the record's future, None (not this way, nothing changed) or NULL
   (an error). args: (producer, topic, value, key, headers, partition, timestamp_ms, callback). */
static PyObject *send_path_try(SendPath *self, PyObject *const *args)
{
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
    PyObject *blocking = Py_False;
    PyObject *acquired = PyObject_Vectorcall(self->acquire, &blocking, 1, NULL);
    PyObject *result = NULL, *index = NULL;
    int rc = acquired == NULL ? -1 : 0;
    if (acquired == Py_True) {
        rc = append_locked(self, topic, value, key, partition_ref, partition, num_partitions, size, timestamp, callback,
                           &result, &index);
        PyObject *type = NULL, *exc = NULL, *tb = NULL;
        if (rc < 0)
            PyErr_Fetch(&type, &exc, &tb);
        PyObject *released = PyObject_Vectorcall(self->release, NULL, 0, NULL);
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

static PyObject *SendPath_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "SendPath(producer, topic, value, key, headers, partition, timestamp_ms, callback)");
        return NULL;
    }
    return send_path_try((SendPath *)callable, args);
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

/* ------------------------------------------------------------------ SendMethod */

/* Producer.send itself: the method, called as `producer.send(topic, value, key=...,
   callback=...)`, with no Python frame for a record the SendPath takes. It binds the
   arguments as `send(self, topic, value=None, key=None, headers=None, partition=None,
   timestamp_ms=None, callback=None)` would and offers them to the producer's `_send_path`
   (a SendPath directly, anything else callable by a call, None not at all). Where that
   declines, or the arguments are no binding of those names (an unknown or repeated
   keyword, too many or too few), it calls `wrapped`, the documented Python send, with the
   arguments as given: so every error and every other record is Python's, as are its name,
   docstring and signature (`__wrapped__`). A declined record is offered to the path once
   more there, which declines it again at once: one C call for a record in a few thousand.
   A method descriptor (Py_TPFLAGS_METHOD_DESCRIPTOR), as a builtin method is:
   `producer.send(...)` binds no method object per call. */

#define SEND_ARGUMENTS 8 /* producer, topic, value, key, headers, partition, timestamp_ms, callback */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *wrapped; /* the Python send: every call the path does not take; its name, doc and signature */
} SendMethod;

static PyObject *argument_names[SEND_ARGUMENTS]; /* interned: "self", "topic", "value", ... */
static PyObject *str_send_path;

/* The index of keyword `name` among send's arguments (not self: from 1, topic), or -1.
   A call's keyword names are interned, as these are: compared by identity first. */
static int argument_index(PyObject *name)
{
    for (int i = 1; i < SEND_ARGUMENTS; i++)
        if (name == argument_names[i])
            return i;
    for (int i = 1; i < SEND_ARGUMENTS; i++) {
        int equal = PyUnicode_Check(name) ? PyUnicode_Compare(name, argument_names[i]) : -1;
        if (equal == 0)
            return i;
        if (equal == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    return -1;
}

static PyObject *SendMethod_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SendMethod *self = (SendMethod *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs >= 1 && nargs + nkw >= 2 && nargs <= SEND_ARGUMENTS) {
        PyObject *bound[SEND_ARGUMENTS];
        int ok = 1;
        for (Py_ssize_t i = 0; i < SEND_ARGUMENTS; i++)
            bound[i] = i < nargs ? args[i] : NULL;
        for (Py_ssize_t j = 0; j < nkw && ok; j++) {
            int i = argument_index(PyTuple_GET_ITEM(kwnames, j));
            if (i < 0 || bound[i] != NULL)
                ok = 0; /* Python's TypeError */
            else
                bound[i] = args[nargs + j];
        }
        if (ok && bound[1] != NULL) {
            for (int i = 2; i < SEND_ARGUMENTS; i++)
                if (bound[i] == NULL)
                    bound[i] = Py_None;
            PyObject *path = PyObject_GetAttr(bound[0], str_send_path);
            if (path == NULL)
                return NULL;
            PyObject *future;
            if (Py_IS_TYPE(path, &SendPathType))
                future = send_path_try((SendPath *)path, bound);
            else if (path != Py_None)
                future = PyObject_Vectorcall(path, bound, SEND_ARGUMENTS, NULL);
            else
                future = Py_NewRef(Py_None);
            Py_DECREF(path);
            if (future != Py_None)
                return future; /* the record's future, or NULL: the path's error */
            Py_DECREF(future);
        }
    }
    /* Declined, or not a binding of send's arguments: Python's send, which offers the
       record to the path once more (it declines again at once) and otherwise raises the
       TypeError in its own name, waits, opens a batch... */
    return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
}

static PyObject *SendMethod_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *SendMethod_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *SendMethod_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"wrapped", NULL};
    PyObject *wrapped;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:SendMethod", kwlist, &wrapped))
        return NULL;
    if (!PyCallable_Check(wrapped)) {
        PyErr_SetString(PyExc_TypeError, "SendMethod: wrapped must be callable");
        return NULL;
    }
    SendMethod *self = (SendMethod *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = SendMethod_vectorcall;
    self->wrapped = Py_NewRef(wrapped);
    return (PyObject *)self;
}

static int SendMethod_traverse(SendMethod *self, visitproc visit, void *arg)
{
    Py_VISIT(self->wrapped);
    return 0;
}

static int SendMethod_clear(SendMethod *self)
{
    Py_CLEAR(self->wrapped);
    return 0;
}

static void SendMethod_dealloc(SendMethod *self)
{
    PyObject_GC_UnTrack(self);
    SendMethod_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* __doc__, __name__, __qualname__, __module__ and __annotations__: the wrapped function's. */
static PyObject *SendMethod_getattro(PyObject *self, PyObject *name)
{
    if (PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) > 4 && PyUnicode_READ_CHAR(name, 0) == '_' &&
        PyUnicode_READ_CHAR(name, 1) == '_') {
        static const char *from_wrapped[] = {"__doc__", "__name__", "__qualname__", "__module__", "__annotations__",
                                             "__defaults__", "__kwdefaults__", NULL};
        for (int i = 0; from_wrapped[i] != NULL; i++)
            if (PyUnicode_CompareWithASCIIString(name, from_wrapped[i]) == 0)
                return PyObject_GetAttr(((SendMethod *)self)->wrapped, name);
    }
    return PyObject_GenericGetAttr(self, name);
}

static PyMemberDef SendMethod_members[] = {
    {"__wrapped__", T_OBJECT_EX, offsetof(SendMethod, wrapped), READONLY, "the Python send, documented"},
    {NULL},
};

static PyTypeObject SendMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rayk.client._send.SendMethod",
    .tp_doc = "Producer.send, offering each record to the producer's SendPath first; see rayk/client/_send.c.",
    .tp_basicsize = sizeof(SendMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = SendMethod_new,
    .tp_traverse = (traverseproc)SendMethod_traverse,
    .tp_clear = (inquiry)SendMethod_clear,
    .tp_dealloc = (destructor)SendMethod_dealloc,
    .tp_call = SendMethod_call,
    .tp_descr_get = SendMethod_get,
    .tp_getattro = SendMethod_getattro,
    .tp_members = SendMethod_members,
    .tp_vectorcall_offset = offsetof(SendMethod, vectorcall),
};

static struct PyModuleDef send_module = {
    PyModuleDef_HEAD_INIT, "_send", "Producer.send's common case, compiled (see _send.c).", -1, send_functions,
};

PyMODINIT_FUNC PyInit__send(void)
{
#define INTERN(var, text)                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(str_producer_closed, "_closed");
    INTERN(str_topics, "_topics");
    INTERN(str_acquire, "acquire");
    INTERN(str_release, "release");
    INTERN(str_send_path, "_send_path");
    INTERN(str_finished, "finished");
    INTERN(str_wait, "wait");
    INTERN(str_named, "_named");
    INTERN(str_error, "error");
    INTERN(str_error_of, "error_of");
    INTERN(str_timeout, "timeout");
    static const char *names[SEND_ARGUMENTS] = {"self", "topic", "value", "key", "headers", "partition",
                                                "timestamp_ms", "callback"};
    for (int i = 0; i < SEND_ARGUMENTS; i++)
        INTERN(argument_names[i], names[i]);
#undef INTERN
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return NULL;
    PyObject *deque = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque == NULL)
        return NULL;
    deque_type = (PyTypeObject *)deque; /* kept for the module's life */
    if ((deque_append = PyObject_GetAttrString(deque, "append")) == NULL)
        return NULL;
    if (PyType_Ready(&SendPathType) < 0 || PyType_Ready(&RecordPlaceType) < 0 || PyType_Ready(&SendMethodType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&send_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "SendPath", (PyObject *)&SendPathType) < 0 ||
        PyModule_AddObjectRef(module, "RecordPlace", (PyObject *)&RecordPlaceType) < 0 ||
        PyModule_AddObjectRef(module, "SendMethod", (PyObject *)&SendMethodType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
