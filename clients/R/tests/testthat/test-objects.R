# obsm arrays, grouped statistics, SingleCellExperiment and Seurat objects,
# on the layered dataset of test_client_r.py (X, layers counts and log,
# raw/X, obsm X_umap float32 and X_pca float64, obs cell_type and age, var
# hv).  Expected values are the file's own, written by the Python harness;
# the objects are checked slot by slot against them and against R's `[`.

url <- Sys.getenv("IVS_URL")
expected_dir <- Sys.getenv("IVS_EXPECTED")
layered <- Sys.getenv("IVS_LAYERED")
if (!nzchar(url) || !nzchar(layered)) stop("run through tests/python/test_client_r.py")
client <- ivs_connect(url)
d <- file.path(expected_dir, layered)
nm <- jsonlite::fromJSON(file.path(d, "names.json"))
obsm_want <- lapply(jsonlite::fromJSON(file.path(d, "obsm.json")), function(m) {
  m <- as.matrix(m)
  rownames(m) <- nm$obs
  m
})
readm <- function(f, cols) {
  M <- as(Matrix::readMM(file.path(d, f)), "CsparseMatrix")
  dimnames(M) <- list(nm$obs, cols)
  M
}
X <- readm("X.mtx", nm$var)
counts <- readm("counts.mtx", nm$var)
rows <- c(7, 3, 200, 1, 50)
genes <- c(30, 2, 5)

test_that("ivs_obsm returns the rows of the selection, float32 and float64 alike", {
  expect_setequal(ivs_obsm_names(client, layered), c("X_umap", "X_pca"))
  for (k in c("X_umap", "X_pca")) {
    got <- ivs_obsm(client, layered, k)
    # float32 values read back exactly as float32 (the JSON holds their float64 value)
    expect_equal(got, obsm_want[[k]], tolerance = 0)
    expect_equal(ivs_obsm(client, layered, k, obs = rows), obsm_want[[k]][rows, , drop = FALSE],
                 tolerance = 0)
    expect_equal(ivs_obsm(client, layered, k, obs = -rows), obsm_want[[k]][-rows, , drop = FALSE],
                 tolerance = 0)
    expect_equal(dim(ivs_obsm(client, layered, k, obs = 0)), c(0L, ncol(obsm_want[[k]])))
  }
  sel <- nm$cell_type == "B"
  expect_equal(ivs_obsm(client, layered, "X_pca", where = "cell_type == 'B'"),
               obsm_want$X_pca[sel, , drop = FALSE], tolerance = 0)
  e <- tryCatch(ivs_obsm(client, layered, "X_nope"), ivserve_error = function(e) e)
  expect_s3_class(e, "ivserve_error")
  expect_identical(e$status, 404L)
})

test_that("ivs_aggregate equals means and fractions computed in R", {
  agg <- ivs_aggregate(client, layered, "cell_type", stats = c("mean", "frac_nonzero", "sum", "var"),
                       var = genes)
  groups <- nm$cell_types[nm$cell_types %in% nm$cell_type]
  expect_identical(rownames(agg$mean), groups)
  expect_identical(colnames(agg$mean), nm$var[genes])
  expect_identical(agg$groups$cell_type, groups)
  for (gr in groups) {
    sub <- as.matrix(X[nm$cell_type == gr, genes, drop = FALSE])
    expect_equal(unname(agg$n_cells[gr]), nrow(sub))
    expect_equal(unname(agg$mean[gr, ]), unname(colMeans(sub)), tolerance = 1e-12)
    expect_equal(unname(agg$sum[gr, ]), unname(colSums(sub)), tolerance = 1e-12)
    expect_equal(unname(agg$frac_nonzero[gr, ]), unname(colMeans(sub != 0)), tolerance = 1e-12)
    expect_equal(unname(agg$var[gr, ]), unname(apply(sub, 2, stats::var)), tolerance = 1e-10)
  }
  # A where filter and a layer.
  agg <- ivs_aggregate(client, layered, "cell_type", stats = "sum", where = "age >= 50",
                       matrix = "layers/counts")
  for (gr in rownames(agg$sum)) {
    keep <- nm$cell_type == gr & nm$age >= 50
    expect_equal(unname(agg$sum[gr, ]), unname(Matrix::colSums(counts[keep, , drop = FALSE])))
  }
})

test_that("as_sce gives a SingleCellExperiment equal to the file's selection", {
  skip_if_not_installed("SingleCellExperiment")
  sce <- as_sce(client, layered, obs = rows, var = genes)
  expect_s4_class(sce, "SingleCellExperiment")
  expect_identical(dim(sce), c(length(genes), length(rows)))
  expect_identical(colnames(sce), nm$obs[rows])
  expect_identical(rownames(sce), nm$var[genes])
  expect_identical(as.matrix(SummarizedExperiment::assay(sce, "counts")),
                   t(as.matrix(X[rows, genes, drop = FALSE])))
  expect_identical(as.matrix(SummarizedExperiment::assay(sce, "counts", withDimnames = TRUE)),
                   t(as.matrix(X))[genes, rows, drop = FALSE])
  expect_identical(as.matrix(SummarizedExperiment::assay(sce, "counts")),
                   t(as.matrix(X[rows, genes, drop = FALSE])))
  cd <- SummarizedExperiment::colData(sce)
  expect_identical(as.character(cd$cell_type), nm$cell_type[rows])
  expect_identical(levels(cd$cell_type), nm$cell_types)
  expect_equal(cd$age, nm$age[rows])
  expect_identical(SummarizedExperiment::rowData(sce)$hv, nm$hv[genes])
  expect_setequal(SingleCellExperiment::reducedDimNames(sce), c("X_umap", "X_pca"))
  expect_equal(SingleCellExperiment::reducedDim(sce, "X_umap"), obsm_want$X_umap[rows, , drop = FALSE],
               tolerance = 0)
  sce2 <- as_sce(client, layered, obs = rows, var = genes, assay = "X", layers = "counts", obsm = FALSE)
  expect_identical(SummarizedExperiment::assayNames(sce2), c("X", "counts"))
  expect_identical(as.matrix(SummarizedExperiment::assay(sce2, "counts")),
                   t(as.matrix(counts[rows, genes, drop = FALSE])))
  expect_length(SingleCellExperiment::reducedDimNames(sce2), 0)
  e <- tryCatch(as_sce(client, layered, obs = rows, layers = "counts"), ivserve_error = function(e) e)
  expect_identical(e$code, "bad_request")
  # A filter, and the whole dataset.
  sce3 <- as_sce(client, layered, where = "cell_type == 'NK'", obsm = "X_pca")
  keep <- nm$cell_type == "NK"
  expect_identical(colnames(sce3), nm$obs[keep])
  expect_equal(SingleCellExperiment::reducedDim(sce3, "X_pca"), obsm_want$X_pca[keep, , drop = FALSE],
               tolerance = 0)
  expect_identical(as.matrix(SummarizedExperiment::assay(sce3)), t(as.matrix(X[keep, , drop = FALSE])))
})

test_that("as_seurat gives a Seurat object equal to the file's selection", {
  skip_if_not_installed("SeuratObject")
  so <- suppressWarnings(as_seurat(client, layered, obs = rows))
  expect_s4_class(so, "Seurat")
  expect_identical(colnames(so), nm$obs[rows])
  expect_identical(rownames(so), nm$var)
  cnt <- SeuratObject::GetAssayData(so, slot = "counts")
  expect_identical(as.matrix(cnt), t(as.matrix(X[rows, , drop = FALSE])))
  md <- so[[]]
  expect_identical(as.character(md$cell_type), nm$cell_type[rows])
  expect_equal(md$age, nm$age[rows])
  expect_setequal(SeuratObject::Reductions(so), c("umap", "pca"))
  emb <- SeuratObject::Embeddings(so, "umap")
  expect_equal(unname(emb), unname(obsm_want$X_umap[rows, , drop = FALSE]), tolerance = 0)
  expect_identical(rownames(emb), nm$obs[rows])
  expect_identical(SeuratObject::Key(so[["pca"]]), "PCA_")
  e <- tryCatch(as_seurat(client, layered, obs = c(1, 1)), ivserve_error = function(e) e)
  expect_s3_class(e, "ivserve_error")
})

test_that("ivs_diffexp: scanpy's columns, t-test equal to R's t.test (Welch)", {
  welch <- function(a, b) tryCatch({
    r <- stats::t.test(a, b, var.equal = FALSE)
    c(unname(r$statistic), r$p.value)
  }, error = function(e) c(0, 1))   # constant data: scanpy's score 0, p 1
  D <- as.matrix(X)
  b <- nm$cell_type == "B"
  de <- ivs_diffexp(client, layered, group1 = "cell_type == 'B'", log1p = FALSE)
  expect_identical(names(de), c("names", "scores", "logfoldchanges", "pvals", "pvals_adj", "pct_nz_group",
                                "pct_nz_reference", "mean_group", "mean_reference"))
  expect_setequal(de$names, nm$var)
  expect_true(all(diff(de$scores) <= 0))
  for (k in seq_len(nrow(de))) {
    w <- welch(D[b, de$names[k]], D[!b, de$names[k]])
    expect_equal(de$scores[k], w[1], tolerance = 1e-9)
    expect_equal(de$pvals[k], w[2], tolerance = 1e-7)
  }
  expect_equal(de$pct_nz_group, unname(colMeans(D[b, de$names] != 0)), tolerance = 1e-12)
  # Two groups as subscripts, top_n from both ends.
  de2 <- ivs_diffexp(client, layered, group1 = which(b), group2 = which(nm$cell_type == "T"), top_n = 2,
                     log1p = FALSE)
  expect_equal(nrow(de2), 4)
  # Every category against the rest.
  rg <- ivs_diffexp(client, layered, group_by = "cell_type", method = "wilcoxon", var = 1:5)
  expect_identical(names(rg)[1:2], c("group", "names"))
  expect_identical(unique(rg$group), nm$cell_types[nm$cell_types %in% nm$cell_type])
  expect_true(all(rg$names %in% nm$var[1:5]))
  e <- tryCatch(ivs_diffexp(client, layered, group_by = "age"), ivserve_error = function(e) e)
  expect_s3_class(e, "ivserve_error")
})
