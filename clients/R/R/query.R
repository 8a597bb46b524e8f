# Selections and results.
#
# Selections follow R's indexing rules, since R users write them: positive
# numbers are 1-based positions (any order, duplicates kept), all-negative
# ones drop those positions, a logical vector of the axis length is a mask,
# a character vector lists names, NULL is everything; `where` / `var_where`
# are filters in the server's grammar.  They are checked here against the
# axis length and sent as the server's 0-based selection objects (a
# contiguous run as a range, so the request stays small).
#
# The result is read from the binary stream (application/vnd.ivserve.csr)
# with readBin and returned as a dgCMatrix of cells x genes, the rows in
# the selection's order, with the obs and var names as dimnames.

ivs_selection <- function(sel, n, axis, names_fn) {
  if (is.null(sel)) return(NULL)
  if (is.logical(sel)) {
    if (length(sel) != n) {
      ivs_stop(NA_integer_, "bad_selection",
               sprintf("%s: a logical mask of length %d does not match the axis length %d",
                       axis, length(sel), n))
    }
    if (anyNA(sel)) ivs_stop(NA_integer_, "bad_selection", paste0(axis, ": NA in a logical mask"))
    return(list(index = I(which(sel) - 1)))
  }
  if (is.character(sel) || is.factor(sel)) return(list(names = I(as.character(sel))))
  if (is.numeric(sel)) {
    if (anyNA(sel)) ivs_stop(NA_integer_, "bad_selection", paste0(axis, ": NA in an index vector"))
    sel <- trunc(sel)
    if (length(sel) && all(sel <= 0)) {
      if (any(-sel > n)) {
        ivs_stop(NA_integer_, "bad_selection", sprintf("%s: index out of bounds (%d)", axis, n))
      }
      sel <- setdiff(seq_len(n), -sel)
    } else if (any(sel < 0)) {
      ivs_stop(NA_integer_, "bad_selection",
               paste0(axis, ": positive and negative indices cannot be mixed"))
    } else {
      sel <- sel[sel != 0]
    }
    if (any(sel > n)) {
      ivs_stop(NA_integer_, "bad_selection",
               sprintf("%s: index %d is out of bounds for an axis of length %d", axis,
                       as.integer(max(sel)), n))
    }
    k <- length(sel)
    if (k > 1 && all(diff(sel) == 1)) return(list(range = c(sel[1] - 1, sel[k])))
    return(list(index = I(sel - 1)))
  }
  ivs_stop(NA_integer_, "bad_selection", paste0(axis, ": cannot select with a ", class(sel)[1]))
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
  vn <- NULL
  pos <- if (is.null(var)) {
    seq_len(n)
  } else if (is.logical(var)) {
    which(var)
  } else if (is.character(var) || is.factor(var)) {
    vn <- ivs_names(client, dataset, axis)
    p <- match(as.character(var), vn)
    if (anyNA(p)) {
      ivs_stop(422L, "unknown_name",
               paste("var names not found:", paste(utils::head(var[is.na(p)], 10), collapse = ", ")))
    }
    p
  } else {
    v <- trunc(var)
    if (length(v) && all(v <= 0)) setdiff(seq_len(n), -v) else v[v != 0]
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

# Reads n little-endian 8-byte integers as doubles (exact below 2^53):
# readBin reads at most 32-bit integers into R's integer type.
read_i64 <- function(con, n, signed = TRUE) {
  if (n == 0) return(numeric(0))
  w <- readBin(con, "integer", n = 2 * n, size = 4, endian = "little")
  if (length(w) != 2 * n) ivs_stop(NA_integer_, "truncated", "the result stream was cut")
  lo <- w[c(TRUE, FALSE)]
  hi <- w[c(FALSE, TRUE)]
  lo <- ifelse(lo < 0, lo + 4294967296, lo)
  if (!signed) hi <- ifelse(hi < 0, hi + 4294967296, hi)
  hi * 4294967296 + lo
}

read_values <- function(con, dtype, n) {
  if (n == 0) return(numeric(0))
  v <- switch(dtype,
    "<f4" = readBin(con, "double", n = n, size = 4, endian = "little"),
    "<f8" = readBin(con, "double", n = n, size = 8, endian = "little"),
    "|i1" = readBin(con, "integer", n = n, size = 1, signed = TRUE),
    "|u1" = readBin(con, "integer", n = n, size = 1, signed = FALSE),
    "<i2" = readBin(con, "integer", n = n, size = 2, signed = TRUE, endian = "little"),
    "<u2" = readBin(con, "integer", n = n, size = 2, signed = FALSE, endian = "little"),
    "<i4" = readBin(con, "integer", n = n, size = 4, endian = "little"),
    "<u4" = {
      x <- readBin(con, "integer", n = n, size = 4, endian = "little")
      ifelse(x < 0, x + 4294967296, x)
    },
    "<i8" = read_i64(con, n, TRUE),
    "<u8" = read_i64(con, n, FALSE),
    ivs_stop(NA_integer_, "bad_stream", paste("unknown value dtype", dtype)))
  if (length(v) != n) ivs_stop(NA_integer_, "truncated", "the result stream was cut")
  as.numeric(v)
}

read_header_str <- function(con) {
  b <- readBin(con, "raw", n = 8)
  if (length(b) != 8) ivs_stop(NA_integer_, "truncated", "the result stream was cut")
  rawToChar(b[b != as.raw(0)])
}

#' Parse a binary result stream (application/vnd.ivserve.csr).
#'
#' @param body a raw vector holding the whole stream.
#' @return list(X = dgCMatrix without dimnames, obs = 0-based dataset rows of X's rows).
ivs_read_stream <- function(body) {
  con <- rawConnection(body, "rb")
  on.exit(close(con))
  cut <- function() ivs_stop(NA_integer_, "truncated", "the result stream was cut (no trailer)")
  magic <- readBin(con, "raw", n = 4)
  if (length(magic) != 4 || rawToChar(magic) != "IVQS") {
    ivs_stop(NA_integer_, "bad_stream", "not an ivserve binary stream")
  }
  version <- readBin(con, "integer", n = 1, size = 4, endian = "little")
  if (!length(version) || version != 1) ivs_stop(NA_integer_, "bad_stream", "unsupported stream version")
  shape <- read_i64(con, 2)
  vdt <- read_header_str(con)
  idt <- read_header_str(con)
  rows <- shape[1]
  cols <- shape[2]
  i_parts <- list()
  j_parts <- list()
  x_parts <- list()
  obs_parts <- list()
  seen <- 0
  nnz_seen <- 0
  repeat {
    kind <- readBin(con, "integer", n = 2, size = 4, endian = "little")
    if (length(kind) != 2) cut()
    nn <- read_i64(con, 2)
    n <- nn[1]
    nnz <- nn[2]
    if (kind[1] == 2) {
      len <- readBin(con, "integer", n = 1, size = 4, endian = "little")
      if (!length(len)) cut()
      msg <- if (len > 0) rawToChar(readBin(con, "raw", n = len)) else ""
      if (kind[2] != 0) {
        err <- tryCatch(jsonlite::fromJSON(msg)$error, error = function(e) NULL)
        ivs_stop(kind[2], if (is.null(err$code)) "stream_error" else err$code,
                 if (is.null(err$message)) msg else err$message)
      }
      if (n != seen || nnz != nnz_seen || seen != rows) {
        ivs_stop(NA_integer_, "bad_stream", "the trailer's counts differ from the stream's")
      }
      break
    }
    if (kind[1] != 1) ivs_stop(NA_integer_, "bad_stream", paste("unknown frame kind", kind[1]))
    if (n < 0 || nnz < 0 || n > rows - seen) {
      ivs_stop(NA_integer_, "bad_stream", "a block does not fit the announced rows")
    }
    obs <- read_i64(con, n)
    indptr <- read_i64(con, n + 1)
    if (indptr[1] != 0 || indptr[n + 1] != nnz || any(diff(indptr) < 0)) {
      ivs_stop(NA_integer_, "bad_stream", "a block's row pointers are not monotone from 0 to its nnz")
    }
    j <- if (idt == "<i8") read_i64(con, nnz) else {
      v <- readBin(con, "integer", n = nnz, size = 4, endian = "little")
      if (length(v) != nnz) cut()
      v
    }
    x <- read_values(con, vdt, nnz)
    if (nnz && (min(j) < 0 || max(j) >= cols)) {
      ivs_stop(NA_integer_, "bad_stream", "a column index is outside the result")
    }
    k <- length(obs_parts) + 1
    obs_parts[[k]] <- obs
    i_parts[[k]] <- seen + rep.int(seq_len(n) - 1, diff(indptr))
    j_parts[[k]] <- j
    x_parts[[k]] <- x
    seen <- seen + n
    nnz_seen <- nnz_seen + nnz
  }
  X <- Matrix::sparseMatrix(i = unlist(i_parts) + 1, j = unlist(j_parts) + 1,
                            x = as.numeric(unlist(x_parts)), dims = c(rows, cols))
  X <- as(X, "CsparseMatrix")
  list(X = X, obs = as.numeric(unlist(obs_parts)))
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

#' Fetch a selection of a dataset as a sparse matrix.
#'
#' @param client from ivs_connect().
#' @param dataset the dataset id.
#' @param obs cells: NULL (all), 1-based positions (negative ones drop), a logical mask, or names.
#' @param var genes, in the same forms.
#' @param where a filter on obs in the server's grammar, e.g. "cell_type == 'B cell'".
#' @param var_where a filter on var.
#' @param matrix NULL (X), "layers/NAME" or "raw/X", as the dataset document lists them; raw/X's
#'   genes (names, masks, positions, var_where) are raw/var's.
#' @return a dgCMatrix, cells x genes, rows in the selection's order, dimnames the obs and var names.
ivs_query <- function(client, dataset, obs = NULL, var = NULL, where = NULL, var_where = NULL,
                      matrix = NULL) {
  mat <- ivs_matrix(client, dataset, matrix)
  body <- ivs_body(client, dataset, obs, var, where, var_where, matrix)
  resp <- ivs_request(client, ivs_path(dataset, "query"), body = body,
                      accept = "application/vnd.ivserve.csr")
  res <- ivs_read_stream(httr2::resp_body_raw(resp))
  X <- res$X
  var_pos <- ivs_var_positions(client, dataset, var, var_where, mat$shape[2], mat$var_axis)
  if (length(var_pos) != ncol(X)) {
    ivs_stop(NA_integer_, "bad_answer", sprintf("%d genes in the result, %d selected",
                                                ncol(X), length(var_pos)))
  }
  obs_names <- ivs_names(client, dataset, "obs")
  var_names <- ivs_names(client, dataset, mat$var_axis)
  dimnames(X) <- list(obs_names[res$obs + 1], var_names[var_pos])
  X
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
