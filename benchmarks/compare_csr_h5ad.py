#!/usr/bin/python3
"""Exits 0 when two standard CSR .h5ad files hold the same X (indptr,
indices and data: same dtypes, same bits) and the same obs and var
datasets, read in slices so that files larger than memory compare too;
prints what it compared.  Used by bench_roundtrip.sh.

Usage: /usr/bin/python3 benchmarks/compare_csr_h5ad.py A.h5ad B.h5ad
"""
import sys
import time

import h5py
import numpy as np


def main(a_path, b_path):
    t = time.time()
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        for k in ("indptr", "indices", "data"):
            da, db = a["X"][k], b["X"][k]
            assert da.shape == db.shape and da.dtype == db.dtype, (k, da.shape, db.shape,
                                                                  da.dtype, db.dtype)
            step = 1 << 27
            for s in range(0, da.shape[0], step):
                x, y = da[s:s + step], db[s:s + step]
                assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), (k, s)
            print(k, da.dtype, da.shape[0], "equal")
        nnz = int(a["X"]["indptr"][-1])
        print("shape", list(a["X"].attrs["shape"]), "nnz", nnz, "past 2^31:", nnz > 2 ** 31,
              "compared in %.1f s" % (time.time() - t))
        for g in ("obs", "var"):
            for k in a[g]:
                if isinstance(a[g][k], h5py.Dataset):
                    assert np.array_equal(a[g][k][()], b[g][k][()]), (g, k)
        print("obs and var datasets equal")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
