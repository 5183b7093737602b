/* Optional native helpers for the hot loops of pcapdecomp. Each function has a pure-Python twin in
 * pcapdecomp/mysql/walk.py with the same contract; tests compare the two. Nothing here keeps state. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_PACKET 0xFFFFFF

/* walk_rows(data, pos, expect) -> (pos, rows, expect, last_start)
 * Counts whole result-set row packets from `pos`: it stops before anything that is not plainly a row (a
 * terminator or error lead byte 0xFE/0xFF, an empty or 16 MiB packet, a packet cut by the end of `data`, a
 * sequence id other than `expect`). last_start is where the last counted row began (-1 when none). */
static PyObject *walk_rows(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    int expect;
    if (!PyArg_ParseTuple(args, "y*ni", &view, &pos, &expect))
        return NULL;
    const unsigned char *d = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, last_start = -1, rows = 0;
    if (pos < 0) pos = 0;
    expect &= 0xFF;
    while (pos + 4 < n) {
        Py_ssize_t length = d[pos] | (d[pos + 1] << 8) | (d[pos + 2] << 16);
        Py_ssize_t end = pos + 4 + length;
        if (length == 0 || length >= MAX_PACKET || end > n || d[pos + 3] != expect)
            break;
        unsigned char first = d[pos + 4];
        if (first == 0xFE || first == 0xFF)
            break;
        expect = (expect + 1) & 0xFF;
        last_start = pos;
        pos = end;
        rows++;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("nnin", pos, rows, expect, last_start);
}

static PyMethodDef methods[] = {
    {"walk_rows", walk_rows, METH_VARARGS, "Count whole row packets: (data, pos, expect) -> (pos, rows, expect, last_start)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "Native hot loops of pcapdecomp.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
