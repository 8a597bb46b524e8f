# obsm arrays, grouped statistics, and the objects R users work in.
#
# ivs_obsm() and ivs_aggregate() read the server's binary answers
# (application/vnd.ivserve.array, .aggregate) with one readBin per array.
# as_sce() and as_seurat() assemble a SingleCellExperiment or a Seurat
# object from one selection: the matrix once (genes x cells, as both
# packages store it), the obs and var rows of the selection in its order,
# and the obsm arrays of the same cells as reduced dimensions.  Both
# packages are optional (Suggests): a clear error names the one missing.

# Reads n little-endian values of an 8-char numpy dtype from raw bytes.
read_dtype <- function(bytes, dtype, n) {
  size <- as.integer(substr(dtype, 3, 3))
  kind <- substr(dtype, 2, 2)
  if (n == 0) return(numeric(0))
  if (kind == "f" && size %in% c(4L, 8L)) {
    return(readBin(bytes, "double", n = n, size = size, endian = "little"))
  }
  if (kind %in% c("i", "u") && size %in% c(1L, 2L, 4L)) {
    v <- readBin(bytes, "integer", n = n, size = size, endian = "little", signed = kind == "i" || size == 4L)
    if (kind == "u" && size == 4L) v <- ifelse(v < 0, v + 4294967296, v)
    return(as.numeric(v))
  }
  if (kind %in% c("i", "u") && size == 8L) {
    w <- readBin(bytes, "integer", n = 2 * n, size = 4, endian = "little")
    lo <- w[c(TRUE, FALSE)]
    return((w[c(FALSE, TRUE)]) * 4294967296 + ifelse(lo < 0, lo + 4294967296, lo))
  }
  ivs_stop(NA_integer_, "bad_stream", paste("unsupported dtype", dtype))
}

u32 <- function(b, at) sum(as.numeric(as.integer(b[at + 0:3])) * 256^(0:3))
u64 <- function(b, at) sum(as.numeric(as.integer(b[at + 0:7])) * 256^(0:7))

# The dense-array answer: list(values = rows x cols matrix, ids = 0-based rows or NULL).
ivs_parse_array <- function(body, name) {
  if (length(body) < 40 || rawToChar(body[1:4]) != "IVAR" || u32(body, 5) != 1) {
    ivs_stop(NA_integer_, "bad_stream", paste0("obsm ", name, ": not an ivserve array (version 1)"))
  }
  rows <- u64(body, 9)
  cols <- u64(body, 17)
  dtype <- rawToChar(body[25:32][body[25:32] != as.raw(0)])
  flags <- u32(body, 33)
  size <- as.integer(substr(dtype, 3, 3))
  off <- 40 + if (bitwAnd(flags, 1L)) 8 * rows else 0
  if (is.na(size) || length(body) != off + rows * cols * size) {
    ivs_stop(NA_integer_, "bad_stream", sprintf("obsm %s: %.0f bytes for a %.0f x %.0f %s array",
                                                name, length(body), rows, cols, dtype))
  }
  ids <- if (bitwAnd(flags, 1L)) read_dtype(body[41:(40 + 8 * rows)], "<i8", rows) else NULL
  vals <- if (rows * cols) read_dtype(body[(off + 1):length(body)], dtype, rows * cols) else numeric(0)
  list(values = matrix(vals, nrow = rows, ncol = cols, byrow = TRUE), ids = ids)
}

#' The names of the obsm arrays a dataset serves.
#'
#' @inheritParams ivs_query
#' @return a character vector.
ivs_obsm_names <- function(client, dataset) {
  listed <- ivs_info(client, dataset)$obsm
  keep <- vapply(listed, function(e) !isFALSE(e$servable), TRUE)
  vapply(listed[keep], function(e) as.character(e$name), "")
}

#' Rows of an obsm array (an embedding such as X_umap) for a selection of cells.
#'
#' @inheritParams ivs_query
#' @param name the array's name, as ivs_obsm_names() lists it.
#' @return a numeric matrix, cells x components, rows in the selection's order, row names the
#'   obs names.
ivs_obsm <- function(client, dataset, name, obs = NULL, where = NULL) {
  if (!name %in% ivs_obsm_names(client, dataset)) {
    ivs_stop(404L, "not_found", sprintf("dataset %s serves no obsm array %s; it serves %s", dataset,
                                        name, paste(ivs_obsm_names(client, dataset), collapse = ", ")))
  }
  n_obs <- as.numeric(unlist(ivs_info(client, dataset)$shape))[1]
  sel <- with_where(ivs_selection(obs, n_obs, "obs"), where)
  body <- if (is.null(sel)) structure(list(), names = character(0)) else list(obs = sel)
  resp <- ivs_request(client, ivs_path(dataset, "obsm", utils::URLencode(name, reserved = TRUE)),
                      body = body, accept = "application/vnd.ivserve.array")
  arr <- ivs_parse_array(httr2::resp_body_raw(resp), name)
  ids <- if (is.null(arr$ids)) seq_len(nrow(arr$values)) - 1 else arr$ids
  rownames(arr$values) <- ivs_names(client, dataset, "obs")[ids + 1]
  arr$values
}

#' Grouped statistics of genes over groups of cells (the server's aggregate route).
#'
#' @inheritParams ivs_query
#' @param group_by one or more categorical obs columns.
#' @param stats among "sum", "mean", "var", "nnz", "frac_nonzero", "max".
#' @param ddof var's delta degrees of freedom (1 as pandas, 0 as numpy).
#' @return a list: one matrix per statistic (groups x genes; row names the group keys, joined
#'   by "_" for several columns; column names the genes), n_cells (cells per group) and groups
#'   (a data.frame of the key columns).
ivs_aggregate <- function(client, dataset, group_by, stats = c("mean", "frac_nonzero"), obs = NULL,
                          var = NULL, where = NULL, var_where = NULL, ddof = 1, matrix = NULL) {
  body <- ivs_body(client, dataset, obs, var, where, var_where, matrix)
  body$group_by <- I(as.character(group_by))
  body$stats <- I(as.character(stats))
  body$ddof <- ddof
  resp <- ivs_request(client, ivs_path(dataset, "aggregate"), body = body,
                      accept = "application/vnd.ivserve.aggregate")
  b <- httr2::resp_body_raw(resp)
  if (length(b) < 16 || rawToChar(b[1:4]) != "IVAG" || u32(b, 5) != 1) {
    ivs_stop(NA_integer_, "bad_stream", "not an ivserve aggregate answer")
  }
  jlen <- u64(b, 9)
  if (jlen > length(b) - 16) ivs_stop(NA_integer_, "bad_stream", "bad aggregate header")
  doc <- jsonlite::fromJSON(rawToChar(b[17:(16 + jlen)]), simplifyVector = FALSE)
  ng <- length(doc$groups)
  nv <- length(doc$genes)
  st <- unlist(doc$stats)
  pos <- ceiling((16 + jlen) / 8) * 8
  if (length(b) != pos + 8 * ng * nv * length(st)) {
    ivs_stop(NA_integer_, "bad_stream", "aggregate values do not match the document")
  }
  keys <- lapply(doc$groups, function(g) vapply(g$key, as.character, ""))
  key_names <- vapply(keys, paste, "", collapse = "_")
  genes <- vapply(doc$genes, function(g) if (is.null(g$name)) NA_character_ else g$name, "")
  out <- list()
  for (s in st) {
    v <- if (ng * nv) readBin(b[(pos + 1):(pos + 8 * ng * nv)], "double", n = ng * nv, size = 8,
                              endian = "little") else numeric(0)
    out[[s]] <- matrix(v, nrow = ng, ncol = nv, byrow = TRUE, dimnames = list(key_names, genes))
    pos <- pos + 8 * ng * nv
  }
  out$n_cells <- stats::setNames(vapply(doc$groups, function(g) as.numeric(g$n_cells), 0), key_names)
  groups <- as.data.frame(do.call(rbind, if (ng) keys else list(character(length(group_by)))),
                          stringsAsFactors = FALSE)
  if (!ng) groups <- groups[0, , drop = FALSE]
  names(groups) <- group_by
  out$groups <- groups
  out
}

need <- function(pkg, fn) {
  if (!requireNamespace(pkg, quietly = TRUE)) {
    ivs_stop(NA_integer_, "missing_package",
             sprintf("%s() needs the R package %s (Debian: r-bioc-/r-cran-%s)", fn, pkg, tolower(pkg)))
  }
}

# Everything as_sce() and as_seurat() put together: the matrix, its obs and
# var rows, the layers asked for and the obsm arrays of the same cells.
ivs_assemble <- function(client, dataset, obs, var, where, var_where, layers, obsm, computed, progress) {
  # Genes x cells, as both packages store counts: the stream's own layout.
  res <- ivs_fetch(client, dataset, obs, var, where, var_where, NULL, progress, genes_by_cells = TRUE)
  cells <- res$obs + 1
  obs_df <- ivs_frame(client, dataset, "obs", NULL, computed)
  var_df <- ivs_frame(client, dataset, "var", NULL, computed)
  pick <- function(df, rows, nm) {
    df <- df[rows, setdiff(names(df), ".index"), drop = FALSE]
    rownames(df) <- NULL
    df
  }
  mats <- list()
  for (ly in layers) {
    # The same cells and genes, by position (names could be ambiguous).
    mats[[ly]] <- ivs_fetch(client, dataset, cells, res$var, NULL, NULL, paste0("layers/", ly),
                            progress, genes_by_cells = TRUE)$X
  }
  arrays <- list()
  names_obsm <- if (isTRUE(obsm)) ivs_obsm_names(client, dataset)
                else if (isFALSE(obsm) || is.null(obsm)) character(0) else as.character(obsm)
  for (nm in names_obsm) {
    arrays[[nm]] <- if (length(cells)) ivs_obsm(client, dataset, nm, obs = cells)
                    else ivs_obsm(client, dataset, nm, obs = integer(0))
  }
  list(X = res$X, layers = mats, obs = pick(obs_df, cells), var = pick(var_df, res$var),
       obsm = arrays, cell_names = colnames(res$X), gene_names = rownames(res$X))
}

#' A selection as a SingleCellExperiment.
#'
#' The matrix goes in as the assay named `assay` (genes x cells), each of
#' `layers` as an assay of its name, the obs rows as colData, the var rows
#' as rowData and the obsm arrays as reducedDims (named as in the file).
#'
#' @inheritParams ivs_query
#' @param assay the name of X's assay.
#' @param layers names of layers (without "layers/") to add as assays.
#' @param obsm TRUE (every obsm array the server serves), FALSE, or names.
#' @param computed also the obs / var columns the server computed.
#' @return a SingleCellExperiment.
as_sce <- function(client, dataset, obs = NULL, var = NULL, where = NULL, var_where = NULL,
                   assay = "counts", layers = NULL, obsm = TRUE, computed = FALSE,
                   progress = interactive()) {
  need("SingleCellExperiment", "as_sce")
  if (assay %in% layers) {
    ivs_stop(NA_integer_, "bad_request",
             sprintf("the layer %s would replace X's assay of the same name: pass assay = \"X\"", assay))
  }
  a <- ivs_assemble(client, dataset, obs, var, where, var_where, layers, obsm, computed, progress)
  assays <- c(stats::setNames(list(a$X), assay), a$layers)
  col_data <- S4Vectors::DataFrame(a$obs, check.names = FALSE, row.names = a$cell_names)
  row_data <- S4Vectors::DataFrame(a$var, check.names = FALSE, row.names = a$gene_names)
  SingleCellExperiment::SingleCellExperiment(assays = assays, colData = col_data, rowData = row_data,
                                             reducedDims = a$obsm)
}

#' A selection as a Seurat object.
#'
#' The matrix goes in as the counts of assay `assay` (genes x cells), the
#' obs rows as meta.data and each obsm array as a reduction: X_umap becomes
#' "umap" with key "UMAP_", X_pca "pca" with key "PC_"-like "PCA_".  Seurat
#' needs unique cell and gene names, and replaces "_" in gene names by "-"
#' (with its own warning).
#'
#' @inheritParams as_sce
#' @return a Seurat object.
as_seurat <- function(client, dataset, obs = NULL, var = NULL, where = NULL, var_where = NULL,
                      assay = "RNA", obsm = TRUE, computed = FALSE, progress = interactive()) {
  need("SeuratObject", "as_seurat")
  a <- ivs_assemble(client, dataset, obs, var, where, var_where, NULL, obsm, computed, progress)
  if (anyDuplicated(a$cell_names) || anyDuplicated(a$gene_names)) {
    ivs_stop(NA_integer_, "bad_selection",
             "a Seurat object needs unique cell and gene names: select each cell and gene once")
  }
  meta <- a$obs
  rownames(meta) <- a$cell_names
  so <- SeuratObject::CreateSeuratObject(counts = a$X, assay = assay, meta.data = meta,
                                         min.cells = 0, min.features = 0)
  for (nm in names(a$obsm)) {
    red <- sub("^X_", "", nm)
    key <- paste0(toupper(gsub("[^A-Za-z0-9]", "", red)), "_")
    emb <- a$obsm[[nm]]
    colnames(emb) <- paste0(key, seq_len(ncol(emb)))
    rownames(emb) <- colnames(so)
    so[[red]] <- SeuratObject::CreateDimReducObject(embeddings = emb, key = key, assay = assay)
  }
  so
}

#' Marker genes: differential expression on the server (its diffexp route).
#'
#' Either two groups of cells (`group1` against `group2`, "rest" being
#' every other cell) or every category of an obs column against the rest or
#' a reference category (`group_by`), by Welch's t-test or the Wilcoxon
#' rank-sum test, as scanpy's rank_genes_groups computes them.
#'
#' @inheritParams ivs_query
#' @param group1,group2 a where filter (one string, e.g. "cell_type == 'B'") or an obs subscript
#'   of any form ivs_query takes; group2 "rest" is every cell not in group1.
#' @param group_by a categorical obs column: each category (or those in `groups`) against
#'   `reference` ("rest" or a category).
#' @param method "t-test" or "wilcoxon".
#' @param top_n keep that many genes from each end of each ranking (NULL: all).
#' @param log1p "auto" (the server decides from the values: counts get log1p), TRUE or FALSE.
#' @param var genes to test (NULL: all), in any subscript form.
#' @return a data.frame with scanpy's rank_genes_groups_df columns, each group's genes best score
#'   first: group (with group_by), names, scores, logfoldchanges, pvals, pvals_adj, then
#'   pct_nz_group, pct_nz_reference, mean_group, mean_reference.
ivs_diffexp <- function(client, dataset, group1 = NULL, group2 = "rest", group_by = NULL,
                        reference = "rest", groups = NULL, method = c("t-test", "wilcoxon"),
                        top_n = NULL, log1p = "auto", var = NULL) {
  method <- match.arg(method)
  shape <- as.numeric(unlist(ivs_info(client, dataset)$shape))
  group <- function(g, what) {
    if (is.character(g) && length(g) == 1) return(list(where = g))
    w <- ivs_selection(g, shape[1], "obs")
    if (is.null(w)) bad_selection("obs", "%s: select some cells, not all of them", what)
    w
  }
  body <- list(method = method, log1p = log1p)
  if (!is.null(group_by)) {
    body$group_by <- group_by
    body$reference <- reference
    if (!is.null(groups)) body$groups <- I(as.character(groups))
  } else {
    if (is.null(group1)) ivs_stop(NA_integer_, "bad_request", "give group1 (and group2) or group_by")
    body$group1 <- group(group1, "group1")
    body$group2 <- if (identical(group2, "rest")) "rest" else group(group2, "group2")
  }
  if (!is.null(top_n)) body$top_n <- as.integer(top_n)
  v <- ivs_selection(var, shape[2], "var")
  if (!is.null(v)) body$var <- v
  resp <- ivs_request(client, ivs_path(dataset, "diffexp"), body = body)
  doc <- jsonlite::fromJSON(httr2::resp_body_string(resp), simplifyVector = FALSE)
  frame <- function(genes, grp) {
    num <- function(k) vapply(genes, function(g) if (is.null(g[[k]])) NA_real_ else as.numeric(g[[k]]), 0)
    df <- data.frame(
      names = vapply(genes, function(g) if (is.null(g$name)) NA_character_ else g$name, ""),
      scores = num("score"), logfoldchanges = num("logfoldchange"), pvals = num("pval"),
      pvals_adj = num("pval_adj"), pct_nz_group = num("frac1"), pct_nz_reference = num("frac2"),
      mean_group = num("mean1"), mean_reference = num("mean2"), stringsAsFactors = FALSE)
    if (!is.null(grp)) df <- cbind(data.frame(group = rep(grp, nrow(df)), stringsAsFactors = FALSE), df)
    df
  }
  if (is.null(group_by)) return(frame(doc$genes, NULL))
  parts <- lapply(doc$groups, function(g) frame(g$genes, as.character(g$key[[1]])))
  if (!length(parts)) return(frame(list(), character(0)))
  out <- do.call(rbind, parts)
  rownames(out) <- NULL
  out
}
