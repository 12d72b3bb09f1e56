/* nsqx._speedups: the two per-message loops of MPUB ingest that no standard-library call
 * does, in C. Each has a pure-Python twin (nsqx.protocol.v2._split_mixed_py,
 * nsqx.storage.records.build_frames_mixed_py) that tests/test_speedups.py checks gives
 * identical results; nsqx.speedups picks this module when it was built and
 * NSQX_NO_SPEEDUPS is not set.
 *
 * split_mixed(body, count, max_msg_size) -> list[bytes] | None
 *     Cut an MPUB body [4B count]([4B size][bytes])* of mixed sizes: the walk is
 *     sequential (each size says where the next is). None when anything is off (the
 *     caller's checking loop then finds upstream's exact error).
 * build_frames_mixed(bodies, ids, timestamp_ns) -> bytes
 *     NSQ message frames [4B size][4B type=2][8B ts][2B attempts=1][16B id][body] for a
 *     batch, ids being the 16-byte ids back to back.
 * strip_no_ext(items) -> list[bytes] | None
 *     MPUB_EXT messages without a header ([0x0000][body]) -> their bodies.
 * split_marked(body, max_msg_size) -> list[bytes] | None
 *     An MPUB_EXT body whose messages after the first have no header -> [first message,
 *     body 2, ..., body n]: split_mixed and strip_no_ext in one walk, one copy each.
 * split_frames(data, max_count, max_bytes) -> tuple
 *     The archiver's split of frames into Parquet columns, without the GIL (twin: the
 *     numpy path of nsqx.storage.archive.split_frames).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_CUT 4096 /* as nsqx.protocol.v2._MAX_CUT: bigger batches take the general walk */

static inline int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Total frame bytes of a batch (34 + body each), whether all bodies have one length;
 * -1 with an exception set when a body is not bytes or too big for a frame. */
static Py_ssize_t frames_size(PyObject **items, Py_ssize_t n, int *uniform) {
    Py_ssize_t total = 0, first = -1;
    *uniform = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_SetString(PyExc_TypeError, "bodies must be bytes");
            return -1;
        }
        Py_ssize_t blen = PyBytes_GET_SIZE(items[i]);
        if (blen > 0x7fffffffLL - 30) {
            PyErr_SetString(PyExc_ValueError, "body too big for a frame");
            return -1;
        }
        if (first < 0)
            first = blen;
        else if (blen != first)
            *uniform = 0;
        total += 34 + blen;
    }
    return total;
}

/* A frame's first 18 bytes: size (body + 30), type 2, timestamp, attempts 1. */
static inline unsigned char *put_head(unsigned char *w, Py_ssize_t blen, uint64_t uts) {
    put32(w, (uint32_t)(blen + 30));
    put32(w + 4, 2);
    put32(w + 8, (uint32_t)(uts >> 32));
    put32(w + 12, (uint32_t)uts);
    w[16] = 0;
    w[17] = 1;
    return w + 18;
}

/* The messages of an MPUB body ([4 count]([4 size][message])*) whose count is ``count``:
 * a list of their bytes, or with ``marked`` the first message whole and the others without
 * their empty 2-byte header (each must have one); Py_None (a new reference) when the body
 * is not that, NULL with an exception when memory runs out. */
static PyObject *cut_messages(const unsigned char *p, Py_ssize_t len, Py_ssize_t count,
                              long long max_size, int marked) {
    if (len < 4 || count < (marked ? 2 : 1) || count > (len - 4) / 5 || count > MAX_CUT)
        Py_RETURN_NONE;
    Py_ssize_t off = 4;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (len - off < 4)
            Py_RETURN_NONE;
        int32_t size = be32(p + off);
        if (size <= 0 || (long long)size > max_size || len - off - 4 < size)
            Py_RETURN_NONE;
        if (marked && i > 0 && (size <= 2 || p[off + 4] != 0 || p[off + 5] != 0))
            Py_RETURN_NONE;
        off += 4 + size;
    }
    if (off != len)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    off = 4;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t size = be32(p + off);
        Py_ssize_t skip = marked && i > 0 ? 2 : 0;
        PyObject *b = PyBytes_FromStringAndSize((const char *)p + off + 4 + skip, size - skip);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, b);
        off += 4 + size;
    }
    return out;
}

static PyObject *split_mixed(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long max_size;
    if (!PyArg_ParseTuple(args, "y*nL", &buf, &count, &max_size))
        return NULL;
    PyObject *out = cut_messages((const unsigned char *)buf.buf, buf.len, count, max_size, 0);
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *build_frames_mixed(PyObject *self, PyObject *args) {
    PyObject *bodies;
    Py_buffer ids;
    long long ts;
    if (!PyArg_ParseTuple(args, "Oy*L", &bodies, &ids, &ts))
        return NULL;
    PyObject *out = NULL;
    PyObject *seq = PySequence_Fast(bodies, "bodies must be a sequence");
    if (seq == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (ids.len != 16 * n) {
        PyErr_SetString(PyExc_ValueError, "ids must hold 16 bytes per body");
        goto done;
    }
    int uniform;
    Py_ssize_t total = frames_size(items, n, &uniform);
    if (total < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *idp = (const unsigned char *)ids.buf;
    uint64_t uts = (uint64_t)ts;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t blen = PyBytes_GET_SIZE(items[i]);
        w = put_head(w, blen, uts);
        memcpy(w, idp + 16 * i, 16);
        memcpy(w + 16, PyBytes_AS_STRING(items[i]), (size_t)blen);
        w += 16 + blen;
    }
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&ids);
    return out;
}

static const char HEX[] = "0123456789abcdef";

/* frames(bodies, partition, base, timestamp_ns) -> (data, flen, rel, sizes): everything
 * PartitionLog.append derives from a batch of more than one body, in one pass. flen is
 * the frame length when all are equal (then rel and sizes are None), else 0 with rel the
 * frame starts plus the end as native int64 bytes (for array("q")) and sizes the frame
 * lengths as 4-byte big-endian (the .sizes file's content). Ids as ids_for_range. */
static PyObject *frames(PyObject *self, PyObject *args) {
    PyObject *bodies;
    long long partition, base, ts;
    if (!PyArg_ParseTuple(args, "OLLL", &bodies, &partition, &base, &ts))
        return NULL;
    PyObject *seq = PySequence_Fast(bodies, "bodies must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *data = NULL, *rel = NULL, *sizes = NULL, *res = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n <= 0 || partition < 0 || partition > 0xFFFF || base < 0 ||
        base + n - 1 > 0xFFFFFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError, "partition %lld / offsets %lld+%zd out of range",
                     partition, base, n);
        goto done;
    }
    int uniform;
    Py_ssize_t total = frames_size(items, n, &uniform);
    if (total < 0)
        goto done;
    Py_ssize_t first = PyBytes_GET_SIZE(items[0]);
    data = PyBytes_FromStringAndSize(NULL, total);
    if (data == NULL)
        goto done;
    int64_t *r = NULL;
    unsigned char *z = NULL;
    if (!uniform) {
        rel = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t));
        sizes = PyBytes_FromStringAndSize(NULL, 4 * n);
        if (rel == NULL || sizes == NULL)
            goto done;
        r = (int64_t *)PyBytes_AS_STRING(rel);
        z = (unsigned char *)PyBytes_AS_STRING(sizes);
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    uint64_t uts = (uint64_t)ts;
    uint64_t id = ((uint64_t)partition << 48) | (uint64_t)base;
    int64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++, id++) {
        Py_ssize_t blen = PyBytes_GET_SIZE(items[i]);
        w = put_head(w, blen, uts);
        for (int k = 0; k < 16; k++)
            w[k] = (unsigned char)HEX[(id >> (60 - 4 * k)) & 0xF];
        memcpy(w + 16, PyBytes_AS_STRING(items[i]), (size_t)blen);
        w += 16 + blen;
        if (r != NULL) {
            r[i] = pos;
            put32(z + 4 * i, (uint32_t)(blen + 34));
        }
        pos += 34 + blen;
    }
    if (r != NULL)
        r[n] = pos;
    if (uniform)
        res = Py_BuildValue("(NnOO)", data, first + 34, Py_None, Py_None);
    else
        res = Py_BuildValue("(NiNN)", data, 0, rel, sizes);
    data = rel = sizes = NULL; /* stolen by "N", also when Py_BuildValue fails */
done:
    Py_XDECREF(data);
    Py_XDECREF(rel);
    Py_XDECREF(sizes);
    Py_DECREF(seq);
    return res;
}

static inline int64_t be64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint64_t)(uint32_t)be32(p + 4));
}

/* split_frames(data, max_count, max_bytes) -> (count, used, bodies, body_offsets, ts,
 *     attempts, ids, min_ts, max_ts)
 * The archiver's column split of NSQ message frames [4B size][4B type=2][8B ts][2B
 * attempts][16B id][body]: the leading whole frames of data, at most max_count of them
 * and, after the first, at most max_bytes; used is the bytes they take (a partial frame at
 * the end is left). bodies back to back, body_offsets int32 (count + 1), ts int64,
 * attempts int32 (native-endian bytes for numpy/pyarrow), ids 16 bytes each. ValueError
 * "malformed frame <k>" (k from 0) for a frame under 34 bytes or not of type 2.
 * One pass without the GIL into outputs sized for the most it can take, shrunk after: the
 * thread needs the GIL back once per call (each return waits for the busy event loop). */
static PyObject *split_frames(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t max_count, max_bytes;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &max_count, &max_bytes))
        return NULL;
    const unsigned char *p = (const unsigned char *)buf.buf;
    Py_ssize_t len = buf.len, count = 0, pos = 0, nbody = 0;
    PyObject *bodies = NULL, *boffs = NULL, *ts = NULL, *att = NULL, *ids = NULL, *res = NULL;
    /* bounds: the bytes it may take (the first frame whole, then max_bytes), and frames */
    Py_ssize_t cap = max_bytes;
    if (len >= 4 && (Py_ssize_t)(4 + (int64_t)(uint32_t)be32(p)) > cap)
        cap = (Py_ssize_t)(4 + (int64_t)(uint32_t)be32(p));
    if (cap > len)
        cap = len;
    if (cap < 0)
        cap = 0;
    Py_ssize_t ccap = cap / 34 < max_count ? cap / 34 : max_count;
    if (ccap < 0)
        ccap = 0;
    if (cap > 0x7fffffffLL) { /* int32 body offsets */
        PyErr_SetString(PyExc_ValueError, "frames too large for one piece");
        goto done;
    }
    bodies = PyBytes_FromStringAndSize(NULL, cap);
    boffs = PyBytes_FromStringAndSize(NULL, 4 * (ccap + 1));
    ts = PyBytes_FromStringAndSize(NULL, 8 * ccap);
    att = PyBytes_FromStringAndSize(NULL, 4 * ccap);
    ids = PyBytes_FromStringAndSize(NULL, 16 * ccap);
    if (!bodies || !boffs || !ts || !att || !ids)
        goto done;
    unsigned char *bw = (unsigned char *)PyBytes_AS_STRING(bodies);
    int32_t *ow = (int32_t *)PyBytes_AS_STRING(boffs);
    int64_t *tw = (int64_t *)PyBytes_AS_STRING(ts);
    int32_t *aw = (int32_t *)PyBytes_AS_STRING(att);
    unsigned char *iw = (unsigned char *)PyBytes_AS_STRING(ids);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    while (count < max_count && len - pos >= 34) {
        int64_t flen = 4 + (int64_t)(uint32_t)be32(p + pos);
        if (flen < 34 || be32(p + pos + 4) != 2) {
            bad = 1;
            break;
        }
        if (flen > len - pos || (count > 0 && pos + flen > max_bytes))
            break;
        const unsigned char *f = p + pos;
        Py_ssize_t blen = (Py_ssize_t)flen - 34;
        int64_t t = be64(f + 8);
        lo = t < lo ? t : lo;
        hi = t > hi ? t : hi;
        tw[count] = t;
        aw[count] = (int32_t)(((uint32_t)f[16] << 8) | f[17]);
        memcpy(iw + 16 * count, f + 18, 16);
        ow[count] = (int32_t)nbody;
        memcpy(bw + nbody, f + 34, (size_t)blen);
        nbody += blen;
        pos += (Py_ssize_t)flen;
        count++;
    }
    ow[count] = (int32_t)nbody;
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_Format(PyExc_ValueError, "malformed frame %zd", count);
        goto done;
    }
    if (_PyBytes_Resize(&bodies, nbody) < 0 || _PyBytes_Resize(&boffs, 4 * (count + 1)) < 0 ||
        _PyBytes_Resize(&ts, 8 * count) < 0 || _PyBytes_Resize(&att, 4 * count) < 0 ||
        _PyBytes_Resize(&ids, 16 * count) < 0)
        goto done;
    res = Py_BuildValue("(nnNNNNNLL)", count, pos, bodies, boffs, ts, att, ids,
                        (long long)lo, (long long)hi);
    bodies = boffs = ts = att = ids = NULL; /* stolen by "N", also when it fails */
done:
    Py_XDECREF(bodies);
    Py_XDECREF(boffs);
    Py_XDECREF(ts);
    Py_XDECREF(att);
    Py_XDECREF(ids);
    PyBuffer_Release(&buf);
    return res;
}

/* strip_no_ext(items) -> list[bytes] | None: MPUB_EXT messages that all carry no header
 * ([0x0000][body], body not empty) -> their bodies; None when any is not bytes, has a
 * header or no body (the caller then splits each). Twin: nsqx.protocol.v2._strip_no_ext_py. */
static PyObject *strip_no_ext(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "items must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(arg, i);
        if (!PyBytes_Check(it) || PyBytes_GET_SIZE(it) <= 2)
            Py_RETURN_NONE;
        const char *p = PyBytes_AS_STRING(it);
        if (p[0] != 0 || p[1] != 0)
            Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(arg, i);
        PyObject *b = PyBytes_FromStringAndSize(PyBytes_AS_STRING(it) + 2,
                                                PyBytes_GET_SIZE(it) - 2);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, b);
    }
    return out;
}

/* split_marked(body, max_msg_size) -> list[bytes] | None: an MPUB_EXT body ([4 count]
 * ([4 size][message])*, count >= 2) whose messages after the first all carry no header
 * ([0x0000][body], body not empty) -> [the first message as sent, body 2, ..., body n]
 * (an idempotent producer's batch: its mark on the first message only). None when the
 * body is not that, or not what split_mixed accepts (the caller then splits it the
 * general way, with its errors). Twin: nsqx.protocol.v2._split_marked_py. */
static PyObject *split_marked(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long max_size;
    if (!PyArg_ParseTuple(args, "y*L", &buf, &max_size))
        return NULL;
    const unsigned char *p = (const unsigned char *)buf.buf;
    Py_ssize_t count = buf.len < 4 ? 0 : be32(p);
    PyObject *out = cut_messages(p, buf.len, count, max_size, 1);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"frames", frames, METH_VARARGS,
     "frames(bodies, partition, base, timestamp_ns) -> (data, flen, rel, sizes)"},
    {"split_mixed", split_mixed, METH_VARARGS,
     "split_mixed(body, count, max_msg_size) -> list[bytes] | None: cut a mixed-size MPUB body"},
    {"build_frames_mixed", build_frames_mixed, METH_VARARGS,
     "build_frames_mixed(bodies, ids, timestamp_ns) -> bytes: NSQ message frames of a batch"},
    {"split_frames", split_frames, METH_VARARGS,
     "split_frames(data, max_count, max_bytes) -> (count, used, bodies, body_offsets, ts, "
     "attempts, ids, min_ts, max_ts): the archiver's column split of message frames"},
    {"split_marked", split_marked, METH_VARARGS,
     "split_marked(body, max_msg_size) -> list[bytes] | None: an idempotent producer's "
     "MPUB_EXT body, cut and its headerless messages stripped in one walk"},
    {"strip_no_ext", strip_no_ext, METH_O,
     "strip_no_ext(items) -> list[bytes] | None: MPUB_EXT bodies without their empty header"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups",
                                    "Per-message loops of MPUB ingest in C (see nsqx.speedups).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
