# Datasets and the obs / var tables.
#
# Columns come one at a time from GET .../obs/{column} (categoricals with
# values=true, their labels row by row), paged by offset/limit, and are
# typed from the dataset document: categoricals become factors with the
# stored category order (ordered factors when the file says so), integers
# R integers (doubles past 32 bits), floats doubles, booleans logicals,
# strings characters, and missing values NA.  Columns the server computed
# from the matrix (total_counts, ...) are left out unless asked for.

#' The datasets a server serves.
#'
#' @param client from ivs_connect().
#' @return a data.frame: id, title, n_obs, n_var, orientation, nnz, dtype, codec, ready.
ivs_datasets <- function(client) {
  doc <- ivs_get_json(client, "/v1/datasets")$datasets
  field <- function(d, k, na) if (is.null(d[[k]])) na else d[[k]]
  data.frame(
    id = vapply(doc, function(d) d$id, ""),
    title = vapply(doc, function(d) field(d, "title", NA_character_), ""),
    n_obs = vapply(doc, function(d) if (is.null(d$shape)) NA_real_ else as.numeric(d$shape[[1]]), 0),
    n_var = vapply(doc, function(d) if (is.null(d$shape)) NA_real_ else as.numeric(d$shape[[2]]), 0),
    orientation = vapply(doc, function(d) field(d, "orientation", NA_character_), ""),
    nnz = vapply(doc, function(d) as.numeric(field(d, "nnz", NA_real_)), 0),
    dtype = vapply(doc, function(d) field(d, "dtype", NA_character_), ""),
    codec = vapply(doc, function(d) field(d, "codec", NA_character_), ""),
    ready = vapply(doc, function(d) isTRUE(d$ready), TRUE),
    stringsAsFactors = FALSE
  )
}

# The dataset document, fetched once per client.
ivs_info <- function(client, dataset) {
  key <- paste0("info:", dataset)
  if (is.null(client$cache[[key]])) {
    client$cache[[key]] <- ivs_get_json(client, ivs_path(dataset))
  }
  client$cache[[key]]
}

# The obs or var names (the table's index), fetched once per client.
ivs_names <- function(client, dataset, axis) {
  key <- paste0("names:", dataset, ":", axis)
  if (is.null(client$cache[[key]])) {
    out <- character(0)
    offset <- 0
    repeat {
      page <- ivs_get_json(client, ivs_path(dataset, axis),
                           list(columns = "", offset = offset, limit = 100000, format = "json"))
      rows <- page$rows
      out <- c(out, vapply(rows, function(r) as.character(r[["_index"]]), ""))
      offset <- offset + length(rows)
      if (offset >= page$total) break
      if (!length(rows)) ivs_stop(NA_integer_, "bad_answer", "an empty table page")
    }
    client$cache[[key]] <- out
  }
  client$cache[[key]]
}

null_to_na <- function(values, na) {
  vapply(values, function(v) if (is.null(v)) na else v, na)
}

# All values of one column, paged (halving the page on 413).
ivs_column_values <- function(client, dataset, axis, name) {
  path <- ivs_path(dataset, axis, utils::URLencode(name, reserved = TRUE))
  values <- list()
  offset <- 0
  limit <- 1000000
  repeat {
    page <- tryCatch(
      ivs_get_json(client, path, list(offset = offset, limit = limit, values = "true")),
      ivserve_error = function(e) {
        if (identical(e$status, 413L) && limit > 1) NULL else stop(e)
      })
    if (is.null(page)) {
      limit <- limit %/% 2
      next
    }
    values <- c(values, page$values)
    offset <- offset + length(page$values)
    if (offset >= page$selected) break
    if (!length(page$values)) ivs_stop(NA_integer_, "bad_answer", "an empty column page")
  }
  values
}

ivs_column <- function(spec, values) {
  type <- spec$type
  if (type == "categorical") {
    levels <- vapply(spec$categories, function(c) c$name, "")
    numeric <- any(vapply(values, is.numeric, TRUE))
    labels <- if (!numeric) {
      vapply(values, function(v) if (is.null(v)) NA_character_ else v, "")
    } else {
      # Numeric categories: rows come as numbers, the levels as the server
      # formats them ("3", "0.5", "True"); match by value, not by text.
      v <- vapply(values, function(x) if (is.null(x)) NA_real_ else as.numeric(x), 0)
      key <- if (all(levels %in% c("True", "False"))) as.numeric(levels == "True")
             else suppressWarnings(as.numeric(levels))
      levels[match(v, key)]
    }
    return(factor(labels, levels = levels, ordered = isTRUE(spec$ordered)))
  }
  if (type == "int") {
    v <- null_to_na(values, NA_real_)
    big <- any(abs(v) > .Machine$integer.max, na.rm = TRUE)
    return(if (big) v else as.integer(v))
  }
  if (type == "float") return(null_to_na(values, NA_real_))
  if (type == "bool") return(null_to_na(values, NA))
  if (type == "string") return(null_to_na(values, NA_character_))
  ivs_stop(NA_integer_, "bad_answer", paste("unknown column type", type))
}

ivs_frame <- function(client, dataset, axis, columns, computed) {
  info <- ivs_info(client, dataset)
  specs <- info[[axis]]$columns
  names(specs) <- vapply(specs, function(c) c$name, "")
  if (is.null(columns)) {
    keep <- vapply(specs, function(c) computed || !isTRUE(c$computed), TRUE)
    columns <- names(specs)[keep]
  } else {
    unknown <- setdiff(columns, names(specs))
    if (length(unknown)) {
      ivs_stop(NA_integer_, "unknown_column",
               sprintf("%s has no column(s) %s", axis, paste(unknown, collapse = ", ")))
    }
  }
  ids <- ivs_names(client, dataset, axis)
  cols <- lapply(columns, function(nm) {
    v <- ivs_column(specs[[nm]], ivs_column_values(client, dataset, axis, nm))
    if (length(v) != length(ids)) {
      ivs_stop(NA_integer_, "bad_answer", sprintf("column %s has %d values for %d rows",
                                                  nm, length(v), length(ids)))
    }
    v
  })
  names(cols) <- columns
  df <- if (length(cols)) as.data.frame(cols, stringsAsFactors = FALSE, optional = TRUE)
        else data.frame(row.names = seq_along(ids))
  if (anyDuplicated(ids)) {
    # data.frame row names must be unique: keep the names as a column.
    df <- cbind(data.frame(.index = ids, stringsAsFactors = FALSE), df)
  } else {
    rownames(df) <- ids
  }
  df
}

#' The obs (cell) table of a dataset.
#'
#' @param client from ivs_connect().
#' @param dataset the dataset id.
#' @param columns column names (default all of the file's).
#' @param computed also the columns the server computed (total_counts, n_genes, ...).
#' @return a data.frame with the obs names as row names.
ivs_obs <- function(client, dataset, columns = NULL, computed = FALSE) {
  ivs_frame(client, dataset, "obs", columns, computed)
}

#' The var (gene) table of a dataset; see ivs_obs().
ivs_var <- function(client, dataset, columns = NULL, computed = FALSE) {
  ivs_frame(client, dataset, "var", columns, computed)
}
