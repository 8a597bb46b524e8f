"""Python client of the ivserve single-cell query server.

    import ivserve
    client = ivserve.connect("http://127.0.0.1:8080")
    ds = client["pbmc_example"]
    ds.shape, ds.obs, ds.var                       # pandas DataFrames
    b = ds.where("cell_type == 'B cell'")[:, ["CD79A", "MS4A1"]]
    b.to_scipy(); b.to_numpy(); b.to_anndata()
    for block in ds.iter_blocks(): ...              # bounded memory

Every failure raises IvserveError (status, code, message).
"""
from .client import Arrays, Client, Dataset, Query, connect
from .errors import IvserveError
from .selection import Where
from .wire import Block

__version__ = "0.1.0"

__all__ = ["connect", "Client", "Dataset", "Query", "Arrays", "Block", "Where", "IvserveError"]
