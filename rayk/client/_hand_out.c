/* The consumer's iteration, compiled: rayk.client.hand_out.HandOut without a Python frame
   per record. `for record in consumer` spent ~40% of its time in the two generators that
   handed each record out (py-spy, 1 M records of 100 B); this is the same loop in C, and
   rayk.client.hand_out.hand_out_reference stays as the reference the tests hold it to.

   HandOut(source, positions, fetcher) -> iterator of records

   Hands out the records of the fetched chunks that `source` (a generator) yields, one at
   a time, each moving its partition's position in `positions` (a dict) past itself:

   - A chunk (a rayk.client.fetcher.FetchedChunk: `records` is a deque of the
     ConsumerRecords decoded so far, `more` true while batches are left to decode) is
     handed out from the position of its partition (`chunk.tp`) as it is when the chunk
     comes; records before it are skipped. Whenever one record or none is left in
     `records` and `chunk.more` is true, `fetcher.decode_more(chunk)` is called (it extends
     `records` in place, or ends `more`) before the next record is taken, so that the
     chunk's last record is known as such; a seek or a forget while it ran (in a
     deserializer) leaves the chunk, as one between two records does. If it raises (an
     Exception) with one record left, that record goes out first, as not the last, and the
     error comes at the next call, when none is left. Each record sets the position to its
     offset + 1; the chunk's last one to at least `chunk.end` (past a tail of control
     batches), and calls `fetcher._drop_if_first(chunk)`.
   - Before each further record of a chunk, if the partition's position is no longer the
     one the last record set (a seek, a poll in between, the partition unassigned) or
     `fetcher._changes` is no longer what it was when the chunk came (a forget, the
     fetcher closed), the chunk is left as it is and `source` is asked for the next one.
   - A chunk whose records are all out moves the position to at least its end, calls
     `fetcher._drop_if_first(chunk)` again (a no-op if its last record did) and `source` is
     asked for the next one.
   - `source` is sent the number of records the last chunk handed out (None the first
     time); when it returns, the iteration ends. What it raises propagates.
   - As a generator: once it raised or ended it stays ended, and a __next__ from Python
     code it runs meanwhile (a callback, a finalizer) raises ValueError. Positions are ints,
     or anything with __index__ (a numpy integer given to seek).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The dict calls taking a hash computed once per chunk (_PyDict_*_KnownHash: CPython's
   own, declared in cpython/dictobject.h since 3.6): a TopicPartition is a tuple, whose hash
   is computed again at every lookup, and the position is read and written per record. */

typedef struct {
    PyObject_HEAD
    PyObject *source;    /* the generator of chunks */
    PyObject *positions; /* dict: TopicPartition -> next offset to hand out */
    PyObject *fetcher;   /* its _changes and _drop_if_first */
    PyObject *fetcher_dict; /* its __dict__, where _changes is read per record; NULL: read by getattr */
    /* The chunk being handed out (NULL: none). */
    PyObject *chunk;
    PyObject *tp;
    Py_hash_t tp_hash;   /* hash(tp), taken once: a position is read and written per record */
    PyObject *records;   /* the chunk's deque */
    PyObject *popleft;   /* records.popleft */
    PyObject *changes;   /* fetcher._changes when the chunk came */
    long long position;  /* what the last record set (or the position when the chunk came) */
    long long end;       /* chunk.end */
    Py_ssize_t handed;   /* records of this chunk handed out */
    int asked;           /* the source was asked at least once: send it a count, not None */
    int done;            /* the source returned, or the iteration raised: as a generator, it is over */
    int running;         /* inside __next__: a nested call (from Python code it runs) is refused */
} HandOut;

static PyObject *str_tp, *str_records, *str_end, *str_popleft, *str_changes, *str_drop_if_first, *str_more,
    *str_decode_more;

static void end_chunk(HandOut *self) {
    Py_CLEAR(self->chunk);
    Py_CLEAR(self->tp);
    Py_CLEAR(self->records);
    Py_CLEAR(self->popleft);
    Py_CLEAR(self->changes);
}

/* An int, or anything with __index__ (a numpy integer given to seek), as a C long long. */
static int long_long_of(PyObject *value, const char *what, long long *out) {
    PyObject *index;
    if (PyLong_CheckExact(value)) {
        *out = PyLong_AsLongLong(value);
        return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
    }
    if (!(index = PyNumber_Index(value))) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(value)->tp_name);
        return -1;
    }
    *out = PyLong_AsLongLong(index);
    Py_DECREF(index);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* fetcher._changes, a new reference: from the fetcher's __dict__ where it is there (a
   lookup in one dict, per record, instead of the attribute protocol's), else by getattr. */
static PyObject *fetcher_changes(HandOut *self) {
    if (self->fetcher_dict != NULL) {
        PyObject *changes = PyDict_GetItemWithError(self->fetcher_dict, str_changes); /* borrowed */
        if (changes != NULL) return Py_NewRef(changes);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_GetAttr(self->fetcher, str_changes);
}

/* Takes `chunk` as the one to hand out. */
static int begin_chunk(HandOut *self, PyObject *chunk) {
    PyObject *end = NULL, *position;
    self->handed = 0;
    self->chunk = Py_NewRef(chunk);
    if (!(self->tp = PyObject_GetAttr(chunk, str_tp))) goto error;
    if (!(self->records = PyObject_GetAttr(chunk, str_records))) goto error;
    if (!(self->popleft = PyObject_GetAttr(self->records, str_popleft))) goto error;
    if (!(end = PyObject_GetAttr(chunk, str_end))) goto error;
    if (long_long_of(end, "chunk.end", &self->end) < 0) goto error;
    Py_CLEAR(end);
    if (!(self->changes = fetcher_changes(self))) goto error;
    if ((self->tp_hash = PyObject_Hash(self->tp)) == -1) goto error;
    position = _PyDict_GetItem_KnownHash(self->positions, self->tp, self->tp_hash); /* borrowed */
    if (position == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, self->tp);
        goto error;
    }
    if (long_long_of(position, "a position", &self->position) < 0) goto error;
    return 0;
error:
    Py_XDECREF(end);
    end_chunk(self);
    return -1;
}

/* 1 if nothing moved the position or changed the fetcher since the last record, 0 if
   something did, -1 on error. */
static int chunk_still_current(HandOut *self) {
    PyObject *position = _PyDict_GetItem_KnownHash(self->positions, self->tp, self->tp_hash); /* borrowed */
    long long value;
    PyObject *changes;
    int same;
    if (position == NULL) return PyErr_Occurred() ? -1 : 0; /* the partition left the positions */
    if (long_long_of(position, "a position", &value) < 0) return -1;
    if (value != self->position) return 0;
    if (!(changes = fetcher_changes(self))) return -1;
    same = changes == self->changes ? 1 : PyObject_RichCompareBool(changes, self->changes, Py_EQ);
    Py_DECREF(changes);
    return same;
}

static int set_position(HandOut *self, long long position) {
    PyObject *value = PyLong_FromLongLong(position);
    int failed;
    if (value == NULL) return -1;
    failed = _PyDict_SetItem_KnownHash(self->positions, self->tp, value, self->tp_hash);
    Py_DECREF(value);
    self->position = position;
    return failed;
}

/* fetcher.<name>(chunk): _drop_if_first, decode_more. 0, or -1 on error. */
static int tell_fetcher(HandOut *self, PyObject *name) {
    PyObject *result = PyObject_CallMethodOneArg(self->fetcher, name, self->chunk);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

/* 1 if the chunk has batches left to decode (chunk.more), 0 if not, -1 on error. */
static int chunk_has_more(HandOut *self) {
    PyObject *more = PyObject_GetAttr(self->chunk, str_more);
    int truth;
    if (more == NULL) return -1;
    truth = PyObject_IsTrue(more);
    Py_DECREF(more);
    return truth;
}

/* The chunk's next record at or after the position (a new reference), NULL with no error
   when its records are all out (the chunk is then ended), NULL with an error. */
static PyObject *next_of_chunk(HandOut *self) {
    for (;;) {
        Py_ssize_t left = PyObject_Length(self->records);
        PyObject *record, *offset_object;
        long long offset;
        int before_undecodable = 0; /* the record left is followed by a batch that does not decode */
        if (left < 0) return NULL;
        if (left <= 1) { /* is the next record the chunk's last? not before its batches are all decoded */
            int more = chunk_has_more(self);
            if (more < 0) return NULL;
            if (more) {
                if (tell_fetcher(self, str_decode_more) == 0) {
                    /* It ran Python (a deserializer): a seek or a forget in it leaves the chunk. */
                    int current = chunk_still_current(self);
                    if (current <= 0) return NULL; /* an error, or none: the chunk is left as it is */
                    continue;
                }
                if (left == 0 || !PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
                /* The record left goes out first, not as the chunk's last; the next call,
                   with none left, meets the same error. */
                PyErr_Clear();
                before_undecodable = 1;
            }
        }
        if (left == 0) { /* past a tail of control batches; done with the chunk */
            if (set_position(self, self->end > self->position ? self->end : self->position) < 0) return NULL;
            if (tell_fetcher(self, str_drop_if_first) < 0) return NULL;
            end_chunk(self);
            return NULL;
        }
        if (!(record = PyObject_CallNoArgs(self->popleft))) return NULL;
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 3) {
            PyErr_Format(PyExc_TypeError, "a chunk's records must be ConsumerRecords, not %.100s",
                         Py_TYPE(record)->tp_name);
            Py_DECREF(record);
            return NULL;
        }
        offset_object = PyTuple_GET_ITEM(record, 2); /* ConsumerRecord.offset */
        if (long_long_of(offset_object, "a record's offset", &offset) < 0) {
            Py_DECREF(record);
            return NULL;
        }
        if (offset < self->position) { /* a batch that starts before the position */
            Py_DECREF(record);
            continue;
        }
        if (left > 1 || before_undecodable) {
            if (set_position(self, offset + 1) < 0) goto error;
        } else { /* the chunk's last record: past its tail of control batches */
            if (set_position(self, self->end > offset + 1 ? self->end : offset + 1) < 0) goto error;
            if (tell_fetcher(self, str_drop_if_first) < 0) goto error; /* its partition's next fetch may go at once */
        }
        self->handed++;
        return record;
    error:
        Py_DECREF(record);
        return NULL;
    }
}

static PyObject *next_record(HandOut *self) {
    for (;;) {
        PyObject *sent, *result;
        PySendResult status;
        if (self->done) return NULL;
        if (self->chunk != NULL) {
            int current = self->handed ? chunk_still_current(self) : 1;
            if (current < 0) return NULL;
            if (current) {
                PyObject *record = next_of_chunk(self);
                if (record != NULL || PyErr_Occurred()) return record;
            }
        }
        sent = self->asked ? PyLong_FromSsize_t(self->handed) : Py_NewRef(Py_None);
        if (sent == NULL) return NULL;
        end_chunk(self);
        self->asked = 1;
        status = PyIter_Send(self->source, sent, &result);
        Py_DECREF(sent);
        if (status == PYGEN_ERROR) return NULL;
        if (status == PYGEN_RETURN) {
            Py_DECREF(result);
            self->done = 1;
            return NULL;
        }
        if (begin_chunk(self, result) < 0) {
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(result);
    }
}

/* __next__: like a generator's, over for good once it raised, and not re-entered. */
static PyObject *hand_out_next(HandOut *self) {
    PyObject *record;
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "HandOut already executing");
        return NULL;
    }
    self->running = 1;
    record = next_record(self);
    self->running = 0;
    if (record == NULL) self->done = 1; /* the source returned, or an error: as a generator, it is over */
    return record;
}

static PyObject *hand_out_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"source", "positions", "fetcher", NULL};
    PyObject *source, *positions, *fetcher;
    HandOut *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:HandOut", keywords, &source, &positions, &fetcher))
        return NULL;
    if (!PyDict_CheckExact(positions)) { /* the _PyDict_ calls would bypass a subclass's methods */
        PyErr_Format(PyExc_TypeError, "positions must be a dict, not %.100s", Py_TYPE(positions)->tp_name);
        return NULL;
    }
    if (!PyGen_Check(source)) { /* it is sent the counts */
        PyErr_Format(PyExc_TypeError, "source must be a generator, not %.100s", Py_TYPE(source)->tp_name);
        return NULL;
    }
    if (!(self = (HandOut *)type->tp_alloc(type, 0))) return NULL;
    self->source = Py_NewRef(source);
    self->positions = Py_NewRef(positions);
    self->fetcher = Py_NewRef(fetcher);
    /* _changes is read from the instance's __dict__ only where that is what getattr reads:
       the generic attribute protocol, and no descriptor of that name on the class (a class
       value is fine: a dict without the name falls back to getattr). The dict is the one
       the instance has now: a fetcher whose __dict__ is replaced afterwards is not one. */
    PyObject *on_class = _PyType_Lookup(Py_TYPE(fetcher), str_changes); /* borrowed */
    if (Py_TYPE(fetcher)->tp_getattro == PyObject_GenericGetAttr &&
        (on_class == NULL || Py_TYPE(on_class)->tp_descr_get == NULL) && _PyObject_GetDictPtr(fetcher) != NULL) {
        self->fetcher_dict = PyObject_GenericGetDict(fetcher, NULL);
        if (self->fetcher_dict != NULL && !PyDict_CheckExact(self->fetcher_dict)) Py_CLEAR(self->fetcher_dict);
        PyErr_Clear(); /* no dict to read: getattr */
    }
    return (PyObject *)self;
}

static int hand_out_traverse(HandOut *self, visitproc visit, void *arg) {
    Py_VISIT(self->source);
    Py_VISIT(self->positions);
    Py_VISIT(self->fetcher);
    Py_VISIT(self->fetcher_dict);
    Py_VISIT(self->chunk);
    Py_VISIT(self->tp);
    Py_VISIT(self->records);
    Py_VISIT(self->popleft);
    Py_VISIT(self->changes);
    return 0;
}

static int hand_out_clear(HandOut *self) {
    self->done = 1;
    Py_CLEAR(self->source);
    Py_CLEAR(self->positions);
    Py_CLEAR(self->fetcher);
    Py_CLEAR(self->fetcher_dict);
    end_chunk(self);
    return 0;
}

static void hand_out_dealloc(HandOut *self) {
    PyObject_GC_UnTrack(self);
    hand_out_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject HandOutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rayk.client._hand_out.HandOut",
    .tp_doc = PyDoc_STR("HandOut(source, positions, fetcher): the records of the chunks `source` yields, one at a "
                        "time, each moving its partition's position past itself (rayk.client.hand_out)."),
    .tp_basicsize = sizeof(HandOut),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = hand_out_new,
    .tp_dealloc = (destructor)hand_out_dealloc,
    .tp_traverse = (traverseproc)hand_out_traverse,
    .tp_clear = (inquiry)hand_out_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)hand_out_next,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rayk.client._hand_out",
    .m_doc = "The consumer's iteration, compiled (rayk.client.hand_out).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__hand_out(void) {
    PyObject *m;
    if (!(str_tp = PyUnicode_InternFromString("tp")) || !(str_records = PyUnicode_InternFromString("records")) ||
        !(str_end = PyUnicode_InternFromString("end")) || !(str_popleft = PyUnicode_InternFromString("popleft")) ||
        !(str_changes = PyUnicode_InternFromString("_changes")) ||
        !(str_drop_if_first = PyUnicode_InternFromString("_drop_if_first")) ||
        !(str_more = PyUnicode_InternFromString("more")) || !(str_decode_more = PyUnicode_InternFromString("decode_more")))
        return NULL;
    if (PyType_Ready(&HandOutType) < 0) return NULL;
    if (!(m = PyModule_Create(&module))) return NULL;
    if (PyModule_AddObjectRef(m, "HandOut", (PyObject *)&HandOutType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
