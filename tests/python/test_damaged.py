"""Files damaged below the HDF5 API must cost only themselves.

Each case writes a valid file with h5py, finds one HDF5 structure by its
address (the global heap collection that holds the obs names, an object
header, the chunk B-tree of packed_indices) and changes bytes in it.  Some
of these changes make libhdf5 itself read out of bounds and die (a heap
object whose size field is damaged does, on the Debian library): the
server reads every file in a child process, so:

- `ivserve check` exits with status 1 and one `ivserve: error:` line that
  names the file and the part being read, never by a signal;
- a server given the damaged files and a good one keeps running, serves
  the good one exactly, leaves the damaged ones out (absent from the
  listing, 404 by id, counted as failed in /metrics) and logs the same
  error that `check` prints.

A sweep changes every byte of each structure in turn and requires a clean
exit (0 or 1, an error line on 1) from `check` for each.
"""

import json
import os
import signal
import struct
import subprocess
import time
import urllib.error
import urllib.request

import h5py
import numpy as np

import ivref
from ivprocess import listening_port  # noqa: E402

N_ROWS, N_COLS = 400, 600


def matrix():
    rng = np.random.default_rng(7)
    return ivref.random_csr(rng, N_ROWS, N_COLS, 7000, np.int32)


def write_good(path):
    ivref.write_iv(path, matrix(), compression="zstd", chunk_len=256)
    return open(path, "rb").read()


def heap_object_of_obs_name(path, blob, row=0):
    """File offset of the global heap object that holds obs name `row`:
    the heap ID in obs/_index's raw data names the collection and the
    object index; the collection is walked to that object."""
    with h5py.File(path, "r") as f:
        d = f["obs/_index"].id
        off = d.get_offset()
        assert off is not None, "obs/_index is not contiguous"
    _, coll, index = struct.unpack_from("<IQI", blob, off + 16 * row)
    assert blob[coll:coll + 4] == b"GCOL"
    end = coll + struct.unpack_from("<Q", blob, coll + 8)[0]
    p = coll + 16
    while p + 16 <= end:
        oi, _, _, size = struct.unpack_from("<HHIQ", blob, p)
        if oi == index:
            assert blob[p + 16:p + 16 + size].decode() == "cell%d" % row
            return p
        if oi == 0:
            break
        p += 16 + ((size + 7) // 8) * 8
    raise AssertionError("heap object %d not found" % index)


def object_header(path, name):
    with h5py.File(path, "r") as f:
        return h5py.h5o.get_info(f[name].id).addr


def chunk_btree(blob, n_chunks):
    """The v1 B-tree node (signature TREE, node type 1 = chunks) indexing
    packed_indices: the only chunk node with one entry per chunk."""
    nodes = []
    i = blob.find(b"TREE")
    while i >= 0:
        if blob[i + 4] == 1 and struct.unpack_from("<H", blob, i + 6)[0] == n_chunks:
            nodes.append(i)
        i = blob.find(b"TREE", i + 1)
    assert len(nodes) == 1, nodes
    return nodes[0]


def n_chunks(path):
    with h5py.File(path, "r") as f:
        d = f["X/packed_indices"]
        return -(-d.shape[0] // d.chunks[0])


def damaged(blob, changes):
    b = bytearray(blob)
    for off, xor in changes:
        b[off] ^= xor
    return bytes(b)


def cases(workdir):
    """name -> (damaged bytes, keywords of the error)."""
    good = os.path.join(workdir, "base.h5ad")
    blob = write_good(good)
    heap = heap_object_of_obs_name(good, blob)
    tree = chunk_btree(blob, n_chunks(good))
    obs_hdr = object_header(good, "obs/_index")
    mp_hdr = object_header(good, "X/major_ptr")
    return {
        # The size of the heap object of "cell0" (bytes 8..15 of its
        # header) made huge: libhdf5 walks off its buffer.
        "heap_object_size": (damaged(blob, [(heap + 15, 0xFF)]),
                             ["obs/_index", "hdf5", "damaged"]),
        "heap_object_size_low": (damaged(blob, [(heap + 8, 0xF0), (heap + 10, 0xFF)]),
                                 ["obs/_index", "damaged"]),
        # Object header version byte: the dataset cannot be opened.
        "ohdr_obs_index": (damaged(blob, [(obs_hdr, 0xFE)]), ["obs", "_index"]),
        "ohdr_major_ptr": (damaged(blob, [(mp_hdr, 0xFE)]), ["major_ptr"]),
        # Chunk B-tree: entries used, and the stored size of chunk 0.
        "btree_entries": (damaged(blob, [(tree + 6, 0xFF), (tree + 7, 0xFF)]),
                          ["packed_indices"]),
        "btree_chunk_size": (damaged(blob, [(tree + 26, 0xFF)]),
                             ["packed_indices", "chunk 0", "past the end"]),
        "btree_child_addr": (damaged(blob, [(tree + 24 + 24 + 5, 0x7F)]),
                             ["packed_indices", "chunk 0"]),
    }


def write_case(workdir, name, data):
    path = os.path.join(workdir, name + ".h5ad")
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def test_base_file_passes_check(ivserve, workdir):
    path = os.path.join(workdir, "base.h5ad")
    write_good(path)
    proc = ivserve.check(path)
    ivserve.assert_ok(proc)
    # check reads the metadata as the server does, and says so.
    assert "obs: 400 rows" in proc.stdout and "var: 600 rows" in proc.stdout, proc.stdout


def test_damaged_files_refused_by_check(ivserve, workdir):
    for name, (data, keywords) in cases(workdir).items():
        path = write_case(workdir, name, data)
        ivserve.assert_error(ivserve.check(path, timeout=120), path, *keywords)


def test_heap_damage_crashes_the_reader(ivserve, workdir):
    """The heap lie is one that kills libhdf5: the reader process dies by
    a signal (or, under a sanitizer, exits on its report), and the error
    says so."""
    data, _ = cases(workdir)["heap_object_size"]
    path = write_case(workdir, "heap", data)
    text = ivserve.assert_error(ivserve.check(path, timeout=120), path)
    assert ("crashed reading obs/_index (signal" in text or
            "died reading obs/_index (exit status" in text), text


def test_duplicated_index_reported_by_check(ivserve, workdir):
    """A duplicated obs name: the server loads the file (a lookup by name
    gives the first row); check reads the index as the server does and
    reports the duplicates."""
    names = np.array(["cell%d" % i for i in range(N_ROWS)], dtype=object)
    names[7] = "cell3"
    path = os.path.join(workdir, "dup.h5ad")
    ivref.write_iv(path, matrix(), obs=names)
    proc = ivserve.check(path)
    ivserve.assert_ok(proc)
    assert "1 duplicated names" in proc.stdout, proc.stdout


def sweep_offsets(workdir):
    good = os.path.join(workdir, "base.h5ad")
    blob = write_good(good)
    heap = heap_object_of_obs_name(good, blob)
    tree = chunk_btree(blob, n_chunks(good))
    obs_hdr = object_header(good, "obs/_index")
    offs = [heap + k for k in range(24)]
    offs += [obs_hdr + k for k in range(0, 48, 2)]
    offs += [tree + k for k in range(0, 72, 2)]
    return blob, offs


def test_sweep_never_crashes_check(ivserve, workdir):
    blob, offs = sweep_offsets(workdir)
    failures = []
    for off in offs:
        path = write_case(workdir, "sweep", damaged(blob, [(off, 0xFF)]))
        proc = ivserve.check(path, timeout=120)
        errs = [l for l in proc.stderr.splitlines() if l.startswith("ivserve: error:")]
        if proc.returncode not in (0, 1) or (proc.returncode == 1 and not errs):
            failures.append((off, proc.returncode, proc.stderr[-500:]))
    assert not failures, failures


# --------------------------------------------------------------- the server


def get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def same_error(msg, log_line):
    """The log line carries check's message.  When the reader died, the
    way it died may differ between two runs under a sanitizer (its report
    and exit, or the signal, depending on where memory lies), so the file
    and what was being read are compared instead."""
    if " reading " not in msg or "damaged" not in msg:
        return json.dumps(msg)[1:-1] in log_line
    head, rest = msg.split(" reading ", 1)
    stage = rest.split(" (", 1)[0]
    path = head.rsplit(": ", 1)[0]
    return (json.dumps(path)[1:-1] in log_line and ("reading %s (" % stage) in log_line
            and "damaged" in log_line)


def test_server_serves_good_file_and_leaves_damaged_ones_out(ivserve, workdir):
    all_cases = cases(workdir)
    good = os.path.join(workdir, "good.h5ad")
    write_good(good)
    bad = {name: write_case(workdir, name, all_cases[name][0])
           for name in ("heap_object_size", "ohdr_major_ptr", "btree_chunk_size")}
    datasets = [{"id": "good", "path": good}] + [{"id": n, "path": p} for n, p in bad.items()]
    cfg = os.path.join(workdir, "cfg.json")
    with open(cfg, "w") as fh:
        json.dump({"datasets": datasets}, fh)
    log = open(os.path.join(workdir, "server.log"), "a+")
    proc = subprocess.Popen([ivserve.path, "--config", cfg, "--port", "0",
                             "--threads", "2"], stdout=log, stderr=log)
    base = "http://127.0.0.1:%d" % listening_port(log.name, proc)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            assert proc.poll() is None, "server died: %s" % open(log.name).read()[-3000:]
            try:
                status, body = get(base + "/v1/datasets", 1)
                if all(d["state"] != "loading" for d in json.loads(body)["datasets"]):
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise AssertionError("server not settled: " + open(log.name).read()[-3000:])
        # Damaged files are listed as failed, answer 503, and keep /readyz
        # (policy "all") not ready.
        status, body = get(base + "/v1/datasets")
        assert status == 200
        states = [(d["id"], d["state"]) for d in json.loads(body)["datasets"]]
        assert states == [("good", "ready")] + [(n, "failed") for n in bad], states
        for name in bad:
            assert get(base + "/v1/datasets/" + name)[0] == 503
        assert get(base + "/readyz")[0] == 503
        status, body = get(base + "/metrics")
        assert 'ivserve_datasets{state="failed"} 3' in body.decode(), body.decode()
        # The good dataset answers exactly, metadata included.
        status, body = get(base + "/v1/datasets/good/query?obs=5,6,7,8,1&format=json")
        assert status == 200, body
        doc = json.loads(body)
        exp = matrix().toarray()[[5, 6, 7, 8, 1], :]
        got = np.zeros_like(exp)
        ip = doc["indptr"]
        for r in range(len(ip) - 1):
            got[r, doc["indices"][ip[r]:ip[r + 1]]] = doc["data"][ip[r]:ip[r + 1]]
        assert np.array_equal(got, exp)
        status, body = get(base + "/v1/datasets/good/query?obs_names=cell3,cell0&format=json")
        assert status == 200 and json.loads(body)["obs"] == [3, 0], body
        assert proc.poll() is None
        text = open(log.name).read()
        # The log names each damaged file with the error check prints.
        for name, path in bad.items():
            line = [l for l in text.splitlines() if "left out" in l and name in l]
            assert line, text[-3000:]
            msg = ivserve.check(path, timeout=120).stderr.split("ivserve: error: ", 1)[1].strip()
            assert same_error(msg, line[0]), (msg, line[0])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
    assert rc == 0, open(log.name).read()[-3000:]


# ------------------------------------- a minor index listed twice in a slice

def with_duplicate(X, orientation, start):
    """X packed, then one slice (the first from `start` on with two value
    groups that allow it) changed so that its second group lists an index
    of its first: every pointer and length stays right, each group still
    rises, and the slice holds that index twice.  Returns (packed, slice,
    index)."""
    enc = ivref.pack(X, orientation)
    d = ivref.decode_varints(enc["packed"]).astype(np.int64)
    vp, mp = enc["value_ptr"], enc["major_ptr"]
    idx = d.copy()
    for g in range(len(vp) - 1):
        idx[vp[g]:vp[g + 1]] = np.cumsum(d[vp[g]:vp[g + 1]] + 1) - 1
    n_major = len(mp) - 1
    for s in list(range(start, n_major)) + list(range(start)):
        if mp[s + 1] - mp[s] < 2:
            continue
        g1, g2 = mp[s], mp[s] + 1
        first, second = idx[vp[g1]:vp[g1 + 1]], idx[vp[g2]:vp[g2 + 1]]
        limit = second[1] if len(second) > 1 else enc["n_minor"]
        cand = [j for j in first if j < limit]
        if not cand:
            continue
        idx[vp[g2]] = cand[-1]
        for g in range(len(vp) - 1):
            a, b = vp[g], vp[g + 1]
            d[a:b] = np.diff(np.concatenate(([-1], idx[a:b]))) - 1
        return ivref.encode_varints(d.astype(np.uint64)), s, int(cand[-1])
    raise AssertionError("no slice with two groups")


DUP_CASES = {
    # name: (orientation, compression, chunk_len, first slice tried)
    "ivcsr_contiguous": ("ivcsr", None, None, 200),
    "ivcsr_small_chunks": ("ivcsr", "zstd", 16, 37),
    "ivcsr_last_slices": ("ivcsr", "zstd", 256, N_ROWS - 3),
    "ivcsc_small_chunks": ("ivcsc", "zstd", 24, 311),
}


def write_duplicate(workdir, name):
    orientation, compression, chunk_len, start = DUP_CASES[name]
    X = matrix()
    packed, s, j = with_duplicate(X, orientation, start)
    path = os.path.join(workdir, "dupidx_%s.h5ad" % name)
    ivref.write_iv(path, X, orientation=orientation, compression=compression,
                   chunk_len=chunk_len, packed=packed)
    return path, s, j


def test_minor_index_listed_twice_is_refused_by_check(ivserve, workdir):
    """A slice that lists one minor index twice (in two value groups) made
    the server answer 500 to every query that touched it; the load (and so
    check) now finds it and names the slice."""
    for name in DUP_CASES:
        path, s, j = write_duplicate(workdir, name)
        proc = ivserve.check(path, timeout=120)
        ivserve.assert_error(proc, path, "slice %d " % s, "index %d twice" % j)
    # The same matrix without the change passes.
    good = os.path.join(workdir, "good.h5ad")
    ivref.write_iv(good, matrix(), compression="zstd", chunk_len=16)
    ivserve.assert_ok(ivserve.check(good))


def test_server_leaves_out_a_slice_listing_an_index_twice_and_bad_metadata(ivserve, workdir):
    """The server loads as check checks: a file with a minor index listed
    twice in a slice, or with categories that repeat, is left out (failed,
    503 by id, the reason logged) rather than served with 500s or with
    metadata anndata cannot read; a good file beside them serves."""
    good = os.path.join(workdir, "good.h5ad")
    write_good(good)
    dup_idx, s, j = write_duplicate(workdir, "ivcsr_small_chunks")
    dup_cat = os.path.join(workdir, "dupcat.h5ad")
    write_good(dup_cat)
    with h5py.File(dup_cat, "r+") as f:
        g = f["obs"].create_group("ct")
        g.attrs["encoding-type"] = "categorical"
        g.attrs["encoding-version"] = "0.2.0"
        g.attrs["ordered"] = False
        g.create_dataset("categories", data=np.array(["T", "B", "T"], dtype=object),
                         dtype=h5py.string_dtype("utf-8"))
        g.create_dataset("codes", data=np.zeros(N_ROWS, np.int8))
        f["obs"].attrs["column-order"] = np.array(["ct"], dtype=object)
    datasets = [{"id": "good", "path": good}, {"id": "dupidx", "path": dup_idx},
                {"id": "dupcat", "path": dup_cat}]
    cfg = os.path.join(workdir, "cfg.json")
    with open(cfg, "w") as fh:
        json.dump({"datasets": datasets}, fh)
    log = open(os.path.join(workdir, "server.log"), "a+")
    proc = subprocess.Popen([ivserve.path, "--config", cfg, "--port", "0", "--threads", "2"],
                            stdout=log, stderr=log)
    base = "http://127.0.0.1:%d" % listening_port(log.name, proc)
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None and time.time() < deadline, open(log.name).read()[-3000:]
            status, body = get(base + "/v1/datasets")
            states = [(d["id"], d["state"]) for d in json.loads(body)["datasets"]]
            if all(st != "loading" for _, st in states):
                break
            time.sleep(0.05)
        assert states == [("good", "ready"), ("dupidx", "failed"), ("dupcat", "failed")], states
        assert get(base + "/v1/datasets/dupidx")[0] == 503
        assert get(base + "/v1/datasets/good/query?obs=%d&format=json" % s)[0] == 200
        text = open(log.name).read()
        assert "slice %d stores minor index %d twice" % (s, j) in text, text[-3000:]
        assert "category 'T' appears twice" in text, text[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
