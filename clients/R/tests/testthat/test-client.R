# The R client against a real server.
#
# Run by tests/python/test_client_r.py, which starts ivserve on fixture
# files and writes, for each dataset, the expected matrix (Matrix Market)
# and the obs / var tables and filter results as anndata and pandas read
# them.  Environment: IVS_URL (the server), IVS_EXPECTED (that folder),
# IVS_DATASETS (comma-separated ids).  Expected selections are R's own
# indexing of the expected matrix, so every form checks against R.

url <- Sys.getenv("IVS_URL")
expected_dir <- Sys.getenv("IVS_EXPECTED")
datasets <- strsplit(Sys.getenv("IVS_DATASETS"), ",")[[1]]
if (!nzchar(url) || !nzchar(expected_dir) || !length(datasets)) {
  stop("IVS_URL, IVS_EXPECTED and IVS_DATASETS must be set (tests/python/test_client_r.py sets them)")
}
layered <- Sys.getenv("IVS_LAYERED")
if (!nzchar(layered)) stop("IVS_LAYERED must be set (tests/python/test_client_r.py sets it)")
client <- ivs_connect(url)

expected <- function(id) {
  d <- file.path(expected_dir, id)
  E <- as(Matrix::readMM(file.path(d, "matrix.mtx")), "CsparseMatrix")
  obs <- jsonlite::fromJSON(file.path(d, "obs.json"), simplifyVector = FALSE)
  var <- jsonlite::fromJSON(file.path(d, "var.json"), simplifyVector = FALSE)
  dimnames(E) <- list(unlist(obs$index), unlist(var$index))
  list(E = E, obs = obs, var = var,
       wheres = jsonlite::fromJSON(file.path(d, "wheres.json"), simplifyVector = FALSE))
}

same_matrix <- function(X, want) {
  expect_s4_class(X, "dgCMatrix")
  expect_identical(dim(X), dim(want))
  # An empty axis's names are NULL in one and character(0) in the other.
  norm <- function(d) lapply(d, function(x) if (length(x)) x else NULL)
  expect_identical(norm(dimnames(X)), norm(dimnames(want)))
  expect_identical(as.matrix(X), as.matrix(want))
}

test_that("ivs_datasets lists every dataset with its shape", {
  d <- ivs_datasets(client)
  expect_setequal(d$id, c(datasets, layered))
  for (id in datasets) {
    E <- expected(id)$E
    expect_equal(c(d$n_obs[d$id == id], d$n_var[d$id == id]), dim(E))
  }
})

for (id in datasets) {
  test_that(paste("every selection form equals R indexing:", id), {
    ex <- expected(id)
    E <- ex$E
    n <- nrow(E)
    g <- ncol(E)
    set.seed(nchar(id))
    ints <- sample.int(n, 12, replace = TRUE)
    gints <- sample.int(g, 15, replace = TRUE)
    mask <- runif(n) < 0.3
    gmask <- runif(g) < 0.2
    onames <- rownames(E)[c(sample.int(n, 6), 1, 1)]
    vnames <- colnames(E)[c(sample.int(g, 7), g, g)]
    cases <- list(
      list(NULL, NULL), list(3, NULL), list(n, 1), list(1, g),
      list(5:n, 1:7), list(1:(n - 3), (g - 9):g), list(seq(1, n, by = 2), seq(g, 1, by = -1)),
      list(seq(n, 1, by = -3), seq(2, g, by = 5)), list(rev(seq_len(n)), NULL),
      list(-1, NULL), list(-(1:5), -g), list(ints, gints), list(integer(0), NULL), list(NULL, integer(0)),
      list(mask, gmask), list(onames, vnames), list(rownames(E)[2], colnames(E)[3]),
      list(c(2, 2, 2), c(1, 1)),
      # R's own rules: zeros dropped, 0 alone selects nothing, zeros among
      # negatives, out-of-range negatives ignored, fractions truncated,
      # short logicals recycled, factors by their codes, logical(0).
      list(0, NULL), list(c(0, 3, 0, 1), c(0, 2)), list(c(-1, 0, -3), 0), list(-(n + 5), -(g + 1)),
      list(c(2.9, 1.2), 1.99), list(c(TRUE, FALSE), c(FALSE, TRUE, TRUE)), list(TRUE, FALSE),
      list(factor(c("b", "a", "b")), factor(c("z", "y"), levels = c("y", "z"))),
      list(logical(0), NULL), list(NULL, logical(0))
    )
    dense <- as.matrix(E)
    for (cs in cases) {
      o <- cs[[1]]
      v <- cs[[2]]
      # R's `[` on a dense copy decides what each form means.
      want_dense <- dense[if (is.null(o)) TRUE else o, if (is.null(v)) TRUE else v, drop = FALSE]
      # Positions by base R's vector `[` (Matrix's own refuses factors).
      at <- function(s, names) if (is.null(s)) seq_along(names) else unname(stats::setNames(seq_along(names), names)[s])
      want <- E[at(o, rownames(E)), at(v, colnames(E)), drop = FALSE]
      expect_identical(as.matrix(want), want_dense)
      X <- ivs_query(client, id, obs = o, var = v)
      same_matrix(X, want)
      same_matrix(ivs_query(client, id, obs = o, var = v, genes_by_cells = TRUE), Matrix::t(want))
      cnt <- ivs_count(client, id, obs = o, var = v)
      expect_equal(c(cnt$n_cells, cnt$n_genes), dim(want))
      expect_equal(cnt$nnz, length(want@x))
    }
    # Names match as the server matches them: exactly, else by a unique
    # case-insensitive match (R's `[` is case-sensitive; the server is not).
    up_o <- toupper(rownames(E)[c(4, 1)])
    up_v <- toupper(colnames(E)[c(g, 2)])
    if (!anyDuplicated(toupper(rownames(E))) && !anyDuplicated(toupper(colnames(E)))) {
      X <- ivs_query(client, id, obs = up_o, var = up_v)
      same_matrix(X, E[c(4, 1), c(g, 2), drop = FALSE])
    }
  })

  test_that(paste("where filters equal pandas:", id), {
    ex <- expected(id)
    E <- ex$E
    for (w in ex$wheres$obs) {
      rows <- as.integer(unlist(w$rows))
      X <- ivs_query(client, id, where = w$where)
      same_matrix(X, E[rows, , drop = FALSE])
      X <- ivs_query(client, id, obs = seq(1, nrow(E), by = 2), var = c(3, 1), where = w$where)
      same_matrix(X, E[intersect(seq(1, nrow(E), by = 2), rows), c(3, 1), drop = FALSE])
      expect_equal(ivs_count(client, id, where = w$where)$n_cells, length(rows))
    }
    for (w in ex$wheres$var) {
      cols <- as.integer(unlist(w$rows))
      same_matrix(ivs_query(client, id, obs = 1:4, var_where = w$where), E[1:4, cols, drop = FALSE])
      keep <- rev(seq_len(ncol(E)))
      same_matrix(ivs_query(client, id, var = keep, var_where = w$where),
                  E[, keep[keep %in% cols], drop = FALSE])
    }
  })

  test_that(paste("ivs_obs and ivs_var equal anndata's tables:", id), {
    ex <- expected(id)
    for (axis in c("obs", "var")) {
      want <- ex[[axis]]
      df <- if (axis == "obs") ivs_obs(client, id) else ivs_var(client, id)
      expect_identical(rownames(df), unlist(want$index))
      expect_identical(names(df), vapply(want$columns, function(c) c$name, ""))
      for (col in want$columns) {
        got <- df[[col$name]]
        vals <- col$values
        isna <- vapply(vals, is.null, TRUE)
        expect_identical(is.na(got), isna, label = col$name)
        plain <- function(na) vapply(vals, function(x) if (is.null(x)) na else x, na)
        if (col$kind == "categorical") {
          expect_true(is.factor(got), label = col$name)
          expect_identical(levels(got), unlist(col$categories), label = col$name)
          expect_identical(is.ordered(got), isTRUE(col$ordered))
          expect_identical(as.character(got), plain(NA_character_), label = col$name)
        } else if (col$kind == "int") {
          expect_true(is.integer(got), label = col$name)
          expect_identical(got, as.integer(plain(NA_real_)), label = col$name)
        } else if (col$kind == "float") {
          expect_identical(got, plain(NA_real_), label = col$name)
        } else if (col$kind == "bool") {
          expect_identical(got, plain(NA), label = col$name)
        } else {
          expect_identical(got, plain(NA_character_), label = col$name)
        }
      }
    }
    # computed columns only when asked for
    axis <- if ("total_counts" %in% names(ivs_obs(client, id, computed = TRUE))) "obs" else "var"
    full <- if (axis == "obs") ivs_obs(client, id, computed = TRUE) else ivs_var(client, id, computed = TRUE)
    sums <- if (axis == "obs") Matrix::rowSums(ex$E) else Matrix::colSums(ex$E)
    expect_equal(as.numeric(full$total_counts), as.numeric(sums), tolerance = 1e-6)
  })
}

test_that("errors are ivserve_error conditions with status, code and message", {
  id <- datasets[1]
  E <- expected(id)$E
  e <- tryCatch(ivs_query(client, "no_such_dataset"), ivserve_error = function(e) e)
  expect_s3_class(e, "ivserve_error")
  expect_identical(e$status, 404L)
  expect_identical(e$code, "not_found")
  e <- tryCatch(ivs_query(client, id, where = "nope_column == 1"), ivserve_error = function(e) e)
  expect_identical(e$status, 422L)
  expect_identical(e$code, "bad_filter")
  e <- tryCatch(ivs_query(client, id, obs = "NOPE_CELL"), ivserve_error = function(e) e)
  expect_identical(e$code, "unknown_name")
  e <- tryCatch(ivs_query(client, id, obs = nrow(E) + 1), ivserve_error = function(e) e)
  expect_identical(e$code, "bad_selection")
  e <- tryCatch(ivs_query(client, id, obs = rep(TRUE, nrow(E) + 1)), ivserve_error = function(e) e)
  expect_identical(e$code, "bad_selection")
  e <- tryCatch(ivs_query(client, id, var = c(-1, 2)), ivserve_error = function(e) e)
  expect_identical(e$code, "bad_selection")
  e <- tryCatch(ivs_query(client, id, obs = c(1, NA)), ivserve_error = function(e) e)
  expect_identical(e$code, "bad_selection")
  e <- tryCatch(ivs_query(client, id, var = "NOPE_GENE"), ivserve_error = function(e) e)
  expect_identical(e$code, "unknown_name")
  e <- tryCatch(ivs_datasets(ivs_connect("http://127.0.0.1:1", timeout = 2)),
                ivserve_error = function(e) e)
  expect_identical(e$code, "connection")
  expect_true(is.na(e$status))
})

test_that("a stream cut before its trailer or ending in an error trailer is an error", {
  id <- datasets[1]
  resp <- httr2::req_perform(httr2::req_headers(
    httr2::req_body_raw(httr2::request(paste0(url, "/v1/datasets/", id, "/query")), "{}",
                        type = "application/json"),
    Accept = "application/vnd.ivserve.csr"))
  body <- httr2::resp_body_raw(resp)
  ok <- ivs_read_stream(body)
  expect_equal(nrow(ok$X), nrow(expected(id)$E))
  # The genes x cells reading is the same matrix, transposed.
  tr <- ivs_read_stream(body, genes_by_cells = TRUE)
  expect_identical(tr$X, Matrix::t(ok$X))
  expect_identical(tr$obs, ok$obs)
  for (cut in c(10, 40, 80, length(body) - 3)) {
    e <- tryCatch(ivs_read_stream(body[seq_len(cut)]), ivserve_error = function(e) e)
    expect_s3_class(e, "ivserve_error")
    e <- tryCatch(ivs_read_stream(body[seq_len(cut)], TRUE), ivserve_error = function(e) e)
    expect_s3_class(e, "ivserve_error")
  }
  # Replace the ok trailer by an error trailer (status 503 and a message).
  msg <- charToRaw('{"error":{"code":"overloaded","message":"try later"}}')
  trailer_at <- length(body) - 28 + 1
  bad <- c(body[seq_len(trailer_at - 1)], as.raw(c(2, 0, 0, 0)), writeBin(503L, raw(), size = 4, endian = "little"),
           body[(trailer_at + 8):(trailer_at + 23)], writeBin(length(msg), raw(), size = 4, endian = "little"), msg)
  e <- tryCatch(ivs_read_stream(bad), ivserve_error = function(e) e)
  expect_identical(e$status, 503L)
  expect_identical(e$code, "overloaded")
})

# A stream written here byte by byte: header, one block, trailer
# (src/decode.c gives the layout); rows is a list of list(j = 0-based
# columns, x = values), in the order the stream lists them.
hand_stream <- function(n_cols, rows, obs = seq_along(rows) + 9) {
  i32 <- function(v) writeBin(as.integer(v), raw(), size = 4, endian = "little")
  i64 <- function(v) unlist(lapply(v, function(x) c(i32(x), i32(if (x < 0) -1L else 0L))))
  f32 <- function(v) writeBin(as.double(v), raw(), size = 4, endian = "little")
  dt <- function(s) c(charToRaw(s), raw(8 - nchar(s)))
  js <- unlist(lapply(rows, `[[`, "j"))
  xs <- unlist(lapply(rows, `[[`, "x"))
  ptr <- c(0, cumsum(vapply(rows, function(r) length(r$j), 0)))
  c(charToRaw("IVQS"), i32(1), i64(length(rows)), i64(n_cols), dt("<f4"), dt("<i4"),
    i32(1), i32(0), i64(length(rows)), i64(length(js)), i64(obs), i64(ptr), i32(js), f32(xs),
    i32(2), i32(0), i64(length(rows)), i64(length(js)), i32(0))
}

test_that("the decoder sorts unsorted rows and refuses repeated or outside columns", {
  body <- hand_stream(4, list(list(j = c(2, 0, 3), x = c(1, 2, 3)), list(j = 3, x = 5),
                              list(j = integer(0), x = numeric(0)), list(j = c(1, 2), x = c(7, 8))))
  want <- matrix(c(2, 0, 1, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 7, 8, 0), 4, 4, byrow = TRUE)
  for (gbc in c(FALSE, TRUE)) {
    r <- ivs_read_stream(body, genes_by_cells = gbc)
    expect_identical(r$obs, c(10, 11, 12, 13))
    got <- if (gbc) t(as.matrix(r$X)) else as.matrix(r$X)
    expect_identical(unname(got), want)
    # A valid dgCMatrix: row numbers sorted within each column.
    expect_true(isTRUE(methods::validObject(r$X, test = TRUE)))
  }
  bad <- list(twice_unsorted = list(list(j = c(2, 0, 2), x = c(1, 2, 3))),
              twice_adjacent = list(list(j = c(1, 1), x = c(1, 2))),
              past_the_end = list(list(j = c(0, 4), x = c(1, 2))),
              negative = list(list(j = c(-1, 2), x = c(1, 2))))
  for (name in names(bad)) {
    for (gbc in c(FALSE, TRUE)) {
      e <- tryCatch(ivs_read_stream(hand_stream(4, bad[[name]]), gbc), ivserve_error = function(e) e)
      expect_s3_class(e, "ivserve_error")
      expect_identical(e$code, "bad_stream", label = name)
    }
  }
})

# A random stream of n_rows x n_cols in several blocks, with the given
# value and index dtypes; each row's columns sorted unless shuffle.
random_stream <- function(n_rows, n_cols, density, n_blocks, vdt, idt, shuffle = FALSE) {
  i32 <- function(v) writeBin(as.integer(v), raw(), size = 4, endian = "little")
  i64 <- function(v) unlist(lapply(v, function(x) c(i32(x), i32(if (x < 0) -1L else 0L))))
  dt <- function(s) c(charToRaw(s), raw(8 - nchar(s)))
  enc_val <- switch(vdt,
                    "<f4" = function(v) writeBin(v, raw(), size = 4, endian = "little"),
                    "<f8" = function(v) writeBin(v, raw(), size = 8, endian = "little"),
                    "<i2" = function(v) writeBin(as.integer(v), raw(), size = 2, endian = "little"),
                    "|u1" = function(v) as.raw(v),
                    "<i8" = function(v) i64(v))
  draw <- switch(vdt, "<f4" = , "<f8" = function(n) stats::rnorm(n) * 100,
                 "<i2" = function(n) sample(-3000:3000, n, TRUE),
                 "|u1" = function(n) sample(1:255, n, TRUE), "<i8" = function(n) sample(-9:99999, n, TRUE))
  enc_idx <- if (idt == "<i4") i32 else i64
  cuts <- sort(sample(0:n_rows, n_blocks - 1, TRUE))
  sizes <- diff(c(0, cuts, n_rows))
  out <- list(charToRaw("IVQS"), i32(1), i64(n_rows), i64(n_cols), dt(vdt), dt(idt))
  nnz <- 0
  for (n in sizes) {
    js <- lapply(seq_len(n), function(r) {
      j <- sort(sample.int(n_cols, stats::rbinom(1, n_cols, density)) - 1)
      if (shuffle && length(j) > 1) j <- sample(j)
      j
    })
    ptr <- c(0, cumsum(lengths(js)))
    jj <- unlist(js)
    if (is.null(jj)) jj <- integer(0)
    out <- c(out, list(i32(1), i32(0), i64(n), i64(length(jj)), i64(sample.int(10^6, n) - 1), i64(ptr),
                       enc_idx(jj), enc_val(draw(length(jj)))))
    nnz <- nnz + length(jj)
  }
  unlist(c(out, list(i32(2), i32(0), i64(n_rows), i64(nnz), i32(0))))
}

test_that("the tiled reordering to cells x genes equals the reference scatter, bit for bit", {
  set.seed(29)
  slots <- function(r) list(r$X@i, r$X@p, r$X@x, r$X@Dim, r$obs)
  cases <- list(list(40, 50, 0.3, 3, "<f4", "<i4"), list(25, 130, 0.5, 4, "<f8", "<i8"),
                list(60, 7, 0.6, 5, "<i2", "<i4"), list(30, 64, 0.2, 1, "|u1", "<i8"),
                list(33, 90, 0.1, 6, "<i8", "<i4"), list(12, 40, 0, 2, "<f4", "<i4"),
                list(0, 10, 0.5, 1, "<f4", "<i4"), list(9, 0, 0.5, 2, "<f4", "<i4"))
  for (cs in cases) {
    body <- do.call(random_stream, cs)
    ref <- ivs_read_stream(body, .tile = 0L)
    expect_true(isTRUE(methods::validObject(ref$X, test = TRUE)))
    for (tl in list(NA_integer_, 1L, 3L, 16L, 1000L)) {
      expect_identical(slots(ivs_read_stream(body, .tile = tl)), slots(ref),
                       label = paste(c(unlist(cs), "tile", tl), collapse = " "))
    }
    # Against R's own transpose of the stream's layout (no reordering there).
    tr <- ivs_read_stream(body, genes_by_cells = TRUE)
    expect_identical(as.matrix(ivs_read_stream(body)$X), t(as.matrix(tr$X)))
  }
  # Unsorted rows: the reference scatter (and the row sort) whatever the tile.
  body <- random_stream(20, 30, 0.4, 3, "<f4", "<i4", shuffle = TRUE)
  ref <- ivs_read_stream(body, .tile = 0L)
  expect_identical(slots(ivs_read_stream(body, .tile = 4L)), slots(ref))
  expect_identical(as.matrix(ref$X), t(as.matrix(ivs_read_stream(body, genes_by_cells = TRUE)$X)))
  expect_true(isTRUE(methods::validObject(ref$X, test = TRUE)))
  # A cut or damaged random stream is still an error with tiles.
  body <- random_stream(40, 50, 0.3, 3, "<f4", "<i4")
  e <- tryCatch(ivs_read_stream(body[seq_len(length(body) - 40)], .tile = 3L),
                ivserve_error = function(e) e)
  expect_s3_class(e, "ivserve_error")
})

test_that("compress = TRUE (gzip answers) and a kept receive buffer give the same matrix", {
  id <- datasets[1]
  plain <- ivs_query(client, id)
  zipped <- ivs_query(ivs_connect(url, compress = TRUE), id)
  expect_identical(zipped, plain)
  # The answer landed in a sink and was released: a second query is equal.
  expect_identical(ivs_query(client, id), plain)
})

test_that("matrix = reads a layer or raw/X, raw/X's genes named and selected by raw/var", {
  d <- file.path(expected_dir, layered)
  nm <- jsonlite::fromJSON(file.path(d, "names.json"))
  read <- function(f, cols) {
    M <- as(Matrix::readMM(file.path(d, f)), "CsparseMatrix")
    dimnames(M) <- list(nm$obs, cols)
    M
  }
  counts <- read("counts.mtx", nm$var)
  raw <- read("raw.mtx", nm$raw_var)
  rows <- nm$rows
  same_matrix(ivs_query(client, layered, obs = rows, var = 3:9, matrix = "layers/counts"),
              counts[rows, 3:9, drop = FALSE])
  same_matrix(ivs_query(client, layered, obs = rows, var = c("gene4", "gene1"),
                        matrix = "layers/counts"),
              counts[rows, c("gene4", "gene1"), drop = FALSE])
  mask <- seq_len(ncol(raw)) %in% c(1, 41, 45)
  same_matrix(ivs_query(client, layered, obs = rows, var = mask, matrix = "raw/X"),
              raw[rows, mask, drop = FALSE])
  picked <- c(nm$raw_var[length(nm$raw_var)], "gene0")
  same_matrix(ivs_query(client, layered, obs = rows, var = picked, matrix = "raw/X"),
              raw[rows, picked, drop = FALSE])
  same_matrix(ivs_query(client, layered, obs = rows, var_where = "mt", matrix = "raw/X"),
              raw[rows, nm$raw_mt, drop = FALSE])
  # X itself is unchanged by the argument's absence and by "X".
  expect_identical(ivs_query(client, layered, obs = rows, var = 1:3),
                   ivs_query(client, layered, obs = rows, var = 1:3, matrix = "X"))
  cnt <- ivs_count(client, layered, obs = rows, matrix = "raw/X")
  expect_equal(cnt$n_genes, ncol(raw))
  expect_equal(cnt$nnz, nm$raw_rows_nnz)
  err <- tryCatch(ivs_query(client, layered, obs = rows, matrix = "layers/nope"),
                  ivserve_error = function(e) e)
  expect_s3_class(err, "ivserve_error")
  expect_identical(err$code, "unknown_matrix")
})
