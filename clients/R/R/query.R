# Selections and results.
#
# Selections follow R's own `[` on a matrix, since R users write them:
# positive numbers are 1-based positions (any order, duplicates kept,
# fractions truncated), zeros are dropped (so obs = 0 selects nothing), a
# vector of negatives (zeros allowed among them) drops those positions
# (out-of-range ones ignored, as `[` does), a logical vector no longer
# than the axis is recycled over it, a factor selects by its integer
# codes (as `[` does), a character vector lists names, NULL is
# everything; `where` / `var_where` are filters in the server's grammar.
# Two departures, for a remote matrix: NA in a subscript is an error (R
# would return a row of NA), and names are matched as the server matches
# them, exactly first, else by a unique ASCII-case-insensitive match.
# They are checked here against the axis length and sent as the server's
# 0-based selection objects (a contiguous run as a range, so the request
# stays small).
#
# The result is read from the binary stream (application/vnd.ivserve.csr)
# by a C routine (src/decode.c) and returned as a dgCMatrix of cells x
# genes, the rows in the selection's order, with the obs and var names as
# dimnames.

bad_selection <- function(axis, fmt, ...) {
  ivs_stop(NA_integer_, "bad_selection", paste0(axis, ": ", sprintf(fmt, ...)))
}

# A subscript as R's `[` reads it: list(all = TRUE), list(pos = 1-based
# positions) or list(names = character).
ivs_subscript <- function(sel, n, axis) {
  if (is.null(sel)) return(list(all = TRUE))
  if (is.factor(sel)) sel <- as.integer(sel)
  if (anyNA(sel)) bad_selection(axis, "NA in a subscript")
  if (is.logical(sel)) {
    if (length(sel) > n) {
      bad_selection(axis, "(subscript) logical subscript too long (%.0f for an axis of length %.0f)",
                    length(sel), n)
    }
    return(list(pos = if (length(sel)) which(rep_len(sel, n)) else integer(0)))
  }
  if (is.character(sel)) return(list(names = sel))
  if (is.numeric(sel)) {
    sel <- trunc(sel)
    sel <- sel[sel != 0]
    if (any(sel < 0)) {
      if (any(sel > 0)) bad_selection(axis, "only 0's may be mixed with negative subscripts")
      drop <- -sel[-sel <= n]
      return(list(pos = if (length(drop)) seq_len(n)[-drop] else seq_len(n)))
    }
    if (length(sel) && max(sel) > n) {
      bad_selection(axis, "subscript out of bounds (%.0f for an axis of length %.0f)", max(sel), n)
    }
    return(list(pos = sel))
  }
  bad_selection(axis, "cannot select with a %s", class(sel)[1])
}

# The server's selection object for a subscript (NULL: everything).
ivs_wire <- function(sub) {
  if (isTRUE(sub$all)) return(NULL)
  if (!is.null(sub$names)) return(list(names = I(as.character(sub$names))))
  sel <- sub$pos
  k <- length(sel)
  if (k > 1 && sel[k] - sel[1] == k - 1 && all(diff(sel) == 1)) return(list(range = c(sel[1] - 1, sel[k])))
  list(index = I(sel - 1))
}

ivs_selection <- function(sel, n, axis) ivs_wire(ivs_subscript(sel, n, axis))

ascii_lower <- function(s) chartr("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", s)

# Positions of names in table as the server finds them: the first row
# with exactly that name, else the row of the one name that equals it up
# to ASCII case (NA when none does, or several distinct names do).
ivs_match_names <- function(x, table) {
  p <- match(x, table)
  miss <- which(is.na(p))
  if (length(miss)) {
    folded <- ascii_lower(table)
    distinct <- folded[!duplicated(table)]
    ambiguous <- unique(distinct[duplicated(distinct)])
    want <- ascii_lower(x[miss])
    q <- match(want, folded)
    q[want %in% ambiguous] <- NA
    p[miss] <- q
  }
  p
}

with_where <- function(sel, where) {
  if (is.null(where)) return(sel)
  if (is.null(sel)) sel <- list()
  sel$where <- where
  sel
}

# The matrix a query reads ("X" when NULL, "layers/NAME", "raw/X"): its
# name for the request (NULL for X), its shape from the dataset document,
# and the table that names its genes (raw/X's are raw/var's).
ivs_matrix <- function(client, dataset, matrix) {
  info <- ivs_info(client, dataset)
  if (is.null(matrix) || identical(matrix, "X")) {
    return(list(name = NULL, shape = as.numeric(unlist(info$shape)), var_axis = "var"))
  }
  for (m in info$matrices) {
    if (!identical(m$name, matrix)) next
    if (isFALSE(m$servable) || is.null(m$shape)) {
      ivs_stop(422L, "unservable", sprintf("%s: %s cannot be served: %s", dataset, matrix,
                                           if (is.null(m$reason)) "no reason given" else m$reason))
    }
    return(list(name = matrix, shape = as.numeric(unlist(m$shape)),
                var_axis = if (identical(matrix, "raw/X")) "raw/var" else "var"))
  }
  known <- vapply(info$matrices, function(m) as.character(m$name), "")
  ivs_stop(404L, "unknown_matrix", sprintf("dataset %s has no matrix %s; it lists %s",
                                           dataset, matrix, paste(known, collapse = ", ")))
}

# 1-based var positions of a selection, in the result's order; axis is
# the table naming the genes ("var", or "raw/var" for raw/X).
ivs_var_positions <- function(client, dataset, var, var_where, n, axis = "var") {
  sub <- ivs_subscript(var, n, "var")
  pos <- if (isTRUE(sub$all)) {
    seq_len(n)
  } else if (!is.null(sub$names)) {
    p <- ivs_match_names(sub$names, ivs_names(client, dataset, axis))
    if (anyNA(p)) {
      ivs_stop(422L, "unknown_name",
               paste("var names not found:", paste(utils::head(sub$names[is.na(p)], 10), collapse = ", ")))
    }
    p
  } else {
    sub$pos
  }
  if (!is.null(var_where)) {
    vn <- ivs_names(client, dataset, axis)
    if (anyDuplicated(vn)) {
      ivs_stop(NA_integer_, "ambiguous",
               "var names are not unique, so the genes a var_where selects cannot be placed")
    }
    matched <- character(0)
    offset <- 0
    repeat {
      page <- ivs_get_json(client, ivs_path(dataset, axis),
                           list(columns = "", where = var_where, offset = offset, limit = 100000))
      matched <- c(matched, vapply(page$rows, function(r) r[["_index"]], ""))
      offset <- offset + length(page$rows)
      if (offset >= page$total || !length(page$rows)) break
    }
    pos <- pos[pos %in% match(matched, vn)]
  }
  pos
}

#' Parse a binary result stream (application/vnd.ivserve.csr).
#'
#' Decoded by the package's C routine (src/decode.c) straight into the
#' slots of a dgCMatrix: no per-value R code and no triplet sort.
#'
#' @param body a raw vector holding the whole stream (or the package's receive buffer).
#' @param genes_by_cells FALSE: X is cells x genes; TRUE: X is its transpose, genes x cells, as
#'   SingleCellExperiment and Seurat store counts, read without any reordering (the stream's
#'   rows are cells, so this is the cheaper form).
#' @param .tile internal: columns per tile of the cells x genes reordering (NA: the default; 0: the
#'   reference scatter it is tested against).
#' @return list(X = dgCMatrix without dimnames, obs = 0-based dataset rows of the cells).
ivs_read_stream <- function(body, genes_by_cells = FALSE, .tile = NA_integer_) {
  res <- .Call(C_ivs_decode_csr, body, !isTRUE(genes_by_cells), as.integer(.tile))
  if (!is.null(res$error)) {
    if (is.raw(res$message)) {
      # An error trailer: the server's JSON error document.
      msg <- rawToChar(res$message)
      err <- tryCatch(jsonlite::fromJSON(msg)$error, error = function(e) NULL)
      ivs_stop(res$status, if (is.null(err$code)) "stream_error" else err$code,
               if (is.null(err$message)) msg else err$message)
    }
    ivs_stop(res$status, res$error, res$message)
  }
  X <- methods::new("dgCMatrix", i = res$i, p = res$p, x = res$x, Dim = res$dim)
  list(X = X, obs = res$obs)
}

ivs_body <- function(client, dataset, obs, var, where, var_where, matrix = NULL) {
  mat <- ivs_matrix(client, dataset, matrix)
  n_obs <- mat$shape[1]
  n_var <- mat$shape[2]
  body <- list()
  if (!is.null(mat$name)) body$matrix <- mat$name
  o <- with_where(ivs_selection(obs, n_obs, "obs"), where)
  v <- with_where(ivs_selection(var, n_var, "var"), var_where)
  if (!is.null(o)) body$obs <- o
  if (!is.null(v)) body$var <- v
  # An empty body must still be a JSON object.
  if (!length(body)) body <- structure(list(), names = character(0))
  body
}

# The selection's result: list(X = dgCMatrix with dimnames (genes x cells
# when genes_by_cells), obs = 0-based
# dataset rows of X's rows, var = 1-based positions of X's columns in the
# genes' table, var_axis = that table).
ivs_fetch <- function(client, dataset, obs, var, where, var_where, matrix, progress,
                      genes_by_cells = FALSE) {
  mat <- ivs_matrix(client, dataset, matrix)
  body <- ivs_body(client, dataset, obs, var, where, var_where, matrix)
  sink <- ivs_request_sink(client, ivs_path(dataset, "query"), body = body,
                           accept = "application/vnd.ivserve.csr", progress = progress)
  res <- tryCatch(ivs_read_stream(sink, genes_by_cells), finally = .Call(C_ivs_sink_release, sink))
  X <- res$X
  n_genes <- if (genes_by_cells) nrow(X) else ncol(X)
  var_pos <- ivs_var_positions(client, dataset, var, var_where, mat$shape[2], mat$var_axis)
  if (length(var_pos) != n_genes) {
    ivs_stop(NA_integer_, "bad_answer", sprintf("%d genes in the result, %d selected",
                                                n_genes, length(var_pos)))
  }
  obs_names <- ivs_names(client, dataset, "obs")
  var_names <- ivs_names(client, dataset, mat$var_axis)
  dn <- list(obs_names[res$obs + 1], var_names[var_pos])
  dimnames(X) <- if (genes_by_cells) rev(dn) else dn
  list(X = X, obs = res$obs, var = var_pos, var_axis = mat$var_axis)
}

#' Fetch a selection of a dataset as a sparse matrix.
#'
#' Subscripts read as R's `[` reads them (see the package README): positive
#' numbers are positions, zeros are dropped, negatives drop positions, a
#' logical vector is recycled over the axis, a factor selects by its codes,
#' names are matched as the server matches them (exactly, else by a unique
#' case-insensitive match), NULL is everything.
#'
#' @param client from ivs_connect().
#' @param dataset the dataset id.
#' @param obs cells: NULL (all), positions, negative positions, a logical vector, or names.
#' @param var genes, in the same forms.
#' @param where a filter on obs in the server's grammar, e.g. "cell_type == 'B cell'".
#' @param var_where a filter on var.
#' @param matrix NULL (X), "layers/NAME" or "raw/X", as the dataset document lists them; raw/X's
#'   genes (names, masks, positions, var_where) are raw/var's.
#' @param progress show a progress bar (cli) while the result arrives; only in an interactive
#'   session.
#' @param genes_by_cells TRUE: the transpose, genes x cells (as SingleCellExperiment and Seurat
#'   store counts), which is the stream's own layout and so decodes without reordering (about
#'   a third to a half of the decoding CPU of cells x genes).
#' @return a dgCMatrix, cells x genes (genes x cells with genes_by_cells), cells in the
#'   selection's order, dimnames the obs and var names.
ivs_query <- function(client, dataset, obs = NULL, var = NULL, where = NULL, var_where = NULL,
                      matrix = NULL, progress = interactive(), genes_by_cells = FALSE) {
  ivs_fetch(client, dataset, obs, var, where, var_where, matrix, progress, genes_by_cells)$X
}

#' The server's count of a selection (no values fetched).
#'
#' @inheritParams ivs_query
#' @return a list: shape, n_cells, n_genes, nnz, total_counts, bytes.
ivs_count <- function(client, dataset, obs = NULL, var = NULL, where = NULL, var_where = NULL,
                      matrix = NULL) {
  body <- ivs_body(client, dataset, obs, var, where, var_where, matrix)
  resp <- ivs_request(client, ivs_path(dataset, "count"), body = body)
  jsonlite::fromJSON(httr2::resp_body_string(resp), simplifyVector = FALSE)
}
