// Talking to ivserve: every URL is relative to the page (so a path prefix
// such as nginx's /ivserve/ just works), the bearer token comes from
// sessionStorage (kept for the tab only, never in a cookie or the URL),
// and an error answer becomes an ApiError carrying the server's own code
// and message, which the page shows as it is.

const TOKEN_KEY = 'ivserve.token';

export function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
}

export function setToken(t) {
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* storage disabled: the token lives as long as the page */ }
  memoryToken = t;
}
let memoryToken = '';

function token() { return getToken() || memoryToken; }

export class ApiError extends Error {
  constructor(status, code, message, path) {
    super(message);
    this.status = status;   // HTTP status, 0 when the server could not be reached
    this.code = code;       // the server's error code ("unknown_name", ...)
    this.path = path;
  }
}

// A relative API path ("v1/datasets") to an absolute URL for display (curl).
export function absUrl(path) { return new URL(path, document.baseURI).href; }

export function dsPath(id, rest = '') {
  return 'v1/datasets/' + encodeURIComponent(id) + rest;
}

async function request(path, { method = 'GET', body, accept } = {}) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  if (accept) headers.Accept = accept;
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'network', 'cannot reach the server (' + e.message + ')', path);
  }
  if (!resp.ok) {
    let code = 'http_' + resp.status;
    let msg = resp.status + ' ' + resp.statusText;
    try {
      const j = await resp.json();
      if (j && j.error) {
        code = j.error.code || code;
        msg = j.error.message || msg;
      }
    } catch (e) { /* not JSON: keep the status line */ }
    throw new ApiError(resp.status, code, msg, path);
  }
  return resp;
}

export async function getJson(path) {
  return (await request(path, { accept: 'application/json' })).json();
}

export async function postJson(path, body) {
  return (await request(path, { method: 'POST', body, accept: 'application/json' })).json();
}

export async function fetchBinary(path, { method = 'GET', body, accept }) {
  const resp = await request(path, { method, body, accept });
  return { buf: await resp.arrayBuffer(), headers: resp.headers };
}

// True when an error means "this server has no such route" rather than a
// failure of a route that exists: the viewer then explains what is missing.
export function isMissingRoute(e) {
  return e instanceof ApiError && (e.status === 404 || e.status === 405) &&
         (e.code === 'not_found' || e.code === 'method_not_allowed' || e.code.startsWith('http_')) &&
         /no such path|not allowed|^404|^405/.test(e.message);
}
