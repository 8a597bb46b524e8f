# HTTP to the server and its errors.
#
# Every failure is signalled as one condition class, "ivserve_error" (also
# an "error"), carrying the HTTP status (NA when no answer came), the
# server's error code and its message, so callers can tryCatch() one class.
# httr2 is told not to turn error statuses into its own conditions: the
# server's JSON error body is read here instead.

ivs_error <- function(status, code, message) {
  structure(
    class = c("ivserve_error", "error", "condition"),
    list(message = sprintf("%s %s: %s", if (is.na(status)) "-" else status, code, message),
         call = NULL, status = status, code = code, detail = message)
  )
}

ivs_stop <- function(status, code, message) stop(ivs_error(status, code, message))

#' Connect to an ivserve server.
#'
#' @param url base URL, e.g. "http://127.0.0.1:8080".
#' @param token bearer token, when the server asks for one.
#' @param timeout seconds a request may take.
#' @param compress ask for gzip binary answers (matrices, arrays): about a third of the bytes
#'   for several times the CPU at both ends, a gain on slow links only.  By default they come
#'   uncompressed (curl would otherwise ask for gzip).
#' @return an "ivs_client" object for the other ivs_ functions.
ivs_connect <- function(url, token = NULL, timeout = 60, compress = FALSE) {
  client <- list(url = sub("/+$", "", url), token = token, timeout = timeout,
                 compress = isTRUE(compress), cache = new.env(parent = emptyenv()))
  class(client) <- "ivs_client"
  client
}

print.ivs_client <- function(x, ...) {
  cat("<ivserve client ", x$url, ">\n", sep = "")
  invisible(x)
}

ivs_path <- function(dataset, ...) {
  parts <- c("v1", "datasets", utils::URLencode(dataset, reserved = TRUE), ...)
  paste0("/", paste(parts, collapse = "/"))
}

# Signals the ivserve_error of an error answer (status >= 400) from its
# body's text: the server's JSON error document when it is one.
ivs_http_error <- function(status, msg) {
  code <- "http"
  parsed <- tryCatch(jsonlite::fromJSON(msg, simplifyVector = FALSE), error = function(e) NULL)
  if (!is.null(parsed$error$code)) {
    code <- parsed$error$code
    msg <- parsed$error$message
  }
  ivs_stop(status, code, msg)
}

ivs_connection_error <- function(e) {
  if (inherits(e, "ivserve_error")) stop(e)
  ivs_stop(NA_integer_, "connection", conditionMessage(e))
}

# One request; returns the httr2 response or signals an ivserve_error.
ivs_request <- function(client, path, query = NULL, body = NULL, accept = NULL, progress = FALSE) {
  req <- httr2::request(paste0(client$url, path))
  if (isTRUE(progress) && interactive()) req <- with_progress(req, environment())
  req <- httr2::req_timeout(req, client$timeout)
  req <- httr2::req_error(req, is_error = function(resp) FALSE)
  if (!is.null(client$token)) req <- httr2::req_auth_bearer_token(req, client$token)
  if (!is.null(accept)) {
    # Binary answers: curl asks for gzip by default, which costs the
    # server and this process more CPU than the transfer saves locally.
    req <- httr2::req_headers(req, Accept = accept,
                              `Accept-Encoding` = if (isTRUE(client$compress)) "gzip" else "identity")
  }
  if (length(query)) req <- do.call(httr2::req_url_query, c(list(req), query))
  if (!is.null(body)) {
    req <- httr2::req_body_raw(req, jsonlite::toJSON(body, auto_unbox = TRUE, digits = NA),
                               type = "application/json")
  }
  resp <- tryCatch(httr2::req_perform(req), error = ivs_connection_error)
  status <- httr2::resp_status(resp)
  if (status >= 400) ivs_http_error(status, tryCatch(httr2::resp_body_string(resp), error = function(e) ""))
  resp
}

# One POST whose answer is received into a sink (src/sink.c) as it
# arrives, through the curl package's connection read by C, rather than by
# httr2::req_perform, which gathers the body in curl's buffer and then
# copies it into a raw vector: for a large binary answer those copies and
# their fresh pages cost more CPU than decoding it.  The request carries
# what ivs_request would set (headers, token, timeout, progress).
# Returns the sink (an external pointer) or signals an ivserve_error; the
# caller frees its bytes with .Call(C_ivs_sink_release, sink) once read.
ivs_request_sink <- function(client, path, body, accept, progress = FALSE) {
  h <- curl::new_handle()
  json <- charToRaw(as.character(jsonlite::toJSON(body, auto_unbox = TRUE, digits = NA)))
  curl::handle_setopt(h, post = TRUE, postfieldsize = length(json), postfields = json,
                      timeout_ms = client$timeout * 1000)
  headers <- list(Accept = accept, `Content-Type` = "application/json",
                  `Accept-Encoding` = if (isTRUE(client$compress)) "gzip" else "identity")
  if (!is.null(client$token)) headers$Authorization <- paste("Bearer", client$token)
  do.call(curl::handle_setheaders, c(list(h), headers))
  if (isTRUE(progress) && interactive()) do.call(curl::handle_setopt, c(list(h), progress_options(environment())))
  sink <- .Call(C_ivs_sink_new)
  con <- curl::curl(paste0(client$url, path), handle = h)
  tryCatch({
    # "f": an error status is an answer to read, not a failure to open.
    open(con, "rbf")
    .Call(C_ivs_sink_fill, sink, con)
  }, error = ivs_connection_error, finally = close(con))
  status <- curl::handle_data(h)$status_code
  if (status >= 400) {
    # An error document is short; a longer body is cut for the message.
    msg <- .Call(C_ivs_sink_raw, sink, 65536)
    .Call(C_ivs_sink_release, sink)
    ivs_http_error(status, tryCatch(rawToChar(msg), error = function(e) ""))
  }
  sink
}

ivs_get_json <- function(client, path, query = NULL) {
  resp <- ivs_request(client, path, query = query)
  jsonlite::fromJSON(httr2::resp_body_string(resp), simplifyVector = FALSE)
}

# A cli progress bar of the bytes received, through curl's transfer
# callback, owned by the caller's frame (env), so that cli closes it when
# that frame returns.  The answer is streamed (chunked), so its size is not
# known in advance: the bar counts bytes; cli draws it only past its
# show_after delay, so quick answers show none.  Returns curl options (an
# empty list without cli).
progress_options <- function(env) {
  if (!requireNamespace("cli", quietly = TRUE)) return(list())
  bar <- NULL
  list(noprogress = FALSE, xferinfofunction = function(down, up) {
    if (is.null(bar)) {
      bar <<- cli::cli_progress_bar("Receiving", total = NA, type = "download", .envir = env)
    }
    cli::cli_progress_update(id = bar, set = down[2], .envir = env)
    0L
  })
}

with_progress <- function(req, env) do.call(httr2::req_options, c(list(req), progress_options(env)))
