// The embedding scatter: every cell is one point, drawn with WebGL (one
// drawArrays of POINTS over a float32 position buffer and an RGBA byte
// buffer, so 1.26 million cells redraw in a frame), or, where WebGL is not
// available or is a software rasterizer, into an ImageData with a canvas
// 2D context.  A software WebGL (SwiftShader, llvmpipe: a browser with no
// GPU) rasterizes points several times slower than the page's own loop
// (one frame of 200,000 cells in headless Chromium, read back: 158-188 ms
// against 19-25 ms), so the page draws on the CPU there; renderer=webgl
// asks for WebGL anyway, renderer=canvas for the 2D context everywhere.
//
// The view is a centre (data units) and a scale (CSS pixels per data unit,
// the same on both axes so the embedding keeps its shape); y grows upward.
// A transparent overlay canvas on top takes the pointer: drag pans, the
// wheel zooms about the cursor, and in box or lasso mode a drag draws the
// shape there and hands it, in data coordinates, to onSelect.
//
// Level of detail: above LOD_MIN cells, frames drawn while the view moves
// show a fixed sample of LOD_CELLS cells (one cell picked at random from
// each run of n / LOD_CELLS consecutive cells, so every part of the file
// is represented), and every cell is drawn again SETTLE_MS after the last
// movement.  A software renderer (no GPU) then still follows the mouse
// with 1.26 million cells; a GPU never needed it, and still gets it only
// while moving.
//
// Draw order and visibility: setOrder() gives the cells to draw, in the
// order to draw them (later on top): a gene's expressing cells after its
// zeros, hidden categories and filtered cells left out.  WebGL draws it
// with one drawElements over a 32-bit index buffer (OES_element_index_uint,
// which every WebGL 1 implementation we know has); the sample drawn while
// moving keeps the same order and leaves out the same cells.
//
// The overlay also carries the hovered and the pinned cell's rings, drawn
// again whenever the view changes.

const VS = `
attribute vec2 a_pos;
attribute vec4 a_col;
uniform vec2 u_center;
uniform vec2 u_scale;
uniform float u_size;
varying vec4 v_col;
void main() {
  gl_Position = vec4((a_pos - u_center) * u_scale, 0.0, 1.0);
  gl_PointSize = u_size;
  v_col = a_col;
}`;
const FS = `
precision mediump float;
varying vec4 v_col;
void main() {
  vec2 d = gl_PointCoord - vec2(0.5);
  if (dot(d, d) > 0.25) discard;
  gl_FragColor = v_col;
}`;

// Whether a WebGL renderer's name is a software rasterizer's.
function softwareGl(name) {
  return /swiftshader|llvmpipe|softpipe|software/i.test(name || '');
}

// The WebGL renderer's name ('' without WebGL), from a context on a
// canvas of its own that is then let go.
function glRendererName() {
  try {
    const gl = document.createElement('canvas').getContext('webgl');
    if (!gl) return '';
    const info = gl.getExtension('WEBGL_debug_renderer_info');
    const name = String((info && gl.getParameter(info.UNMASKED_RENDERER_WEBGL)) || gl.getParameter(gl.RENDERER) || '');
    const lose = gl.getExtension('WEBGL_lose_context');
    if (lose) lose.loseContext();
    return name;
  } catch (e) {
    return '';
  }
}

const LOD_MIN = 400000;
const LOD_CELLS = 200000;
const SETTLE_MS = 150;

function compile(gl, type, src) {
  const s = gl.createShader(type);
  gl.shaderSource(s, src);
  gl.compileShader(s);
  if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
  return s;
}

export class Scatter {
  constructor(canvas, overlay, { forceCanvas = false, forceGl = false } = {}) {
    this.canvas = canvas;
    this.overlay = overlay;
    this.n = 0;
    this.xy = null;
    this.rgba = null;
    this.view = { cx: 0, cy: 0, scale: 1 };
    this.order = null;         // Uint32Array of the cells drawn, in order; null = all in file order
    this.rings = [];           // [{i, color}] drawn on the overlay
    this.onClick = null;
    this.onView = null;
    this.mode = 'pan';
    this.onSelect = null;
    this.onHover = null;
    this.drawnPoints = 0;      // what the last frame drew (the test hook reads it)
    this.frames = 0;
    this.onFrame = null;
    this.gl = null;
    // A canvas keeps the first kind of context it gives, so WebGL's
    // renderer is asked of a throwaway canvas first.
    this.glName = forceCanvas || forceGl ? '' : glRendererName();
    this.glSkipped = softwareGl(this.glName) ? 'software WebGL: ' + this.glName : '';
    if (!forceCanvas && !this.glSkipped) {
      try { this.initGl(); } catch (e) { this.gl = null; this.glError = e.message; }
    }
    this.renderer = this.gl ? 'webgl' : 'canvas2d';
    if (!this.gl) this.ctx = canvas.getContext('2d');
    this.octx = overlay.getContext('2d');
    this.bindPointer();
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(canvas);
    this.resize();
  }

  initGl() {
    const gl = this.canvas.getContext('webgl', { antialias: false, preserveDrawingBuffer: true, alpha: false });
    if (!gl) throw new Error('WebGL is not available');
    const p = gl.createProgram();
    gl.attachShader(p, compile(gl, gl.VERTEX_SHADER, VS));
    gl.attachShader(p, compile(gl, gl.FRAGMENT_SHADER, FS));
    gl.linkProgram(p);
    if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(p));
    this.gl = gl;
    this.prog = p;
    this.loc = {
      pos: gl.getAttribLocation(p, 'a_pos'), col: gl.getAttribLocation(p, 'a_col'),
      center: gl.getUniformLocation(p, 'u_center'), scale: gl.getUniformLocation(p, 'u_scale'),
      size: gl.getUniformLocation(p, 'u_size'),
    };
    this.posBuf = gl.createBuffer();
    this.colBuf = gl.createBuffer();
    this.lodPosBuf = gl.createBuffer();
    this.lodColBuf = gl.createBuffer();
    this.idxBuf = gl.createBuffer();
    this.lodIdxBuf = gl.createBuffer();
    this.uintExt = gl.getExtension('OES_element_index_uint');
    const range = gl.getParameter(gl.ALIASED_POINT_SIZE_RANGE);
    this.maxPoint = range ? range[1] : 16;
  }

  // Positions: n cells, xy interleaved (Float32Array of 2n).  Resets the view.
  setPoints(xy, n) {
    this.xy = xy;
    this.n = n;
    this.order = null;
    this.rings = [];
    if (this.gl) {
      const gl = this.gl;
      gl.bindBuffer(gl.ARRAY_BUFFER, this.posBuf);
      gl.bufferData(gl.ARRAY_BUFFER, xy.subarray(0, 2 * n), gl.STATIC_DRAW);
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (let i = 0; i < n; i++) {
      const x = xy[2 * i], y = xy[2 * i + 1];
      if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y;
    }
    this.bounds = n && x0 <= x1 ? { x0, x1, y0, y1 } : { x0: -1, x1: 1, y0: -1, y1: 1 };
    this.makeLod();
    this.fit();
  }

  // The sample drawn while moving (see the top of the file), or none.
  makeLod() {
    this.lod = null;
    const n = this.n;
    if (n <= LOD_MIN) return;
    const idx = new Int32Array(LOD_CELLS), step = n / LOD_CELLS;
    let seed = 12345;
    for (let k = 0; k < LOD_CELLS; k++) {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      idx[k] = Math.min(n - 1, Math.floor(k * step + (seed / 4294967296) * step));
    }
    const xy = new Float32Array(2 * LOD_CELLS);
    for (let k = 0; k < LOD_CELLS; k++) { xy[2 * k] = this.xy[2 * idx[k]]; xy[2 * k + 1] = this.xy[2 * idx[k] + 1]; }
    // Where each cell sits in the sample (-1: not in it), for the sample's order.
    const pos = new Int32Array(n).fill(-1);
    for (let k = 0; k < LOD_CELLS; k++) pos[idx[k]] = k;
    this.lod = { idx, xy, rgba: null, pos, order: null };
    if (this.gl) {
      const gl = this.gl;
      gl.bindBuffer(gl.ARRAY_BUFFER, this.lodPosBuf);
      gl.bufferData(gl.ARRAY_BUFFER, xy, gl.STATIC_DRAW);
    }
  }

  lodColors() {
    const l = this.lod, c = this.rgba, out = new Uint8Array(4 * l.idx.length);
    for (let k = 0; k < l.idx.length; k++) {
      const j = 4 * l.idx[k];
      out[4 * k] = c[j]; out[4 * k + 1] = c[j + 1]; out[4 * k + 2] = c[j + 2]; out[4 * k + 3] = c[j + 3];
    }
    l.rgba = out;
    if (this.gl) {
      const gl = this.gl;
      gl.bindBuffer(gl.ARRAY_BUFFER, this.lodColBuf);
      gl.bufferData(gl.ARRAY_BUFFER, out, gl.DYNAMIC_DRAW);
    }
  }

  // The cells to draw, in order (later on top), or null for every cell in
  // file order.
  setOrder(order) {
    this.order = order;
    if (this.gl && order) {
      const gl = this.gl;
      gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, this.idxBuf);
      gl.bufferData(gl.ELEMENT_ARRAY_BUFFER, order, gl.DYNAMIC_DRAW);
    }
    if (this.lod) {
      const l = this.lod;
      l.order = null;
      if (order) {
        const out = new Uint32Array(order.length);
        let m = 0;
        for (let k = 0; k < order.length; k++) { const p = l.pos[order[k]]; if (p >= 0) out[m++] = p; }
        l.order = out.slice(0, m);
        if (this.gl) {
          const gl = this.gl;
          gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, this.lodIdxBuf);
          gl.bufferData(gl.ELEMENT_ARRAY_BUFFER, l.order, gl.DYNAMIC_DRAW);
        }
      }
    }
    this.requestDraw();
  }

  // Rings around cells on the overlay: [{i, color}].
  setRings(rings) {
    this.rings = rings;
    if (!this.dragging) this.drawRings();
  }

  drawRings() {
    this.clearOverlay();
    if (!this.xy) return;
    const ctx = this.octx, dpr = window.devicePixelRatio || 1, r = this.pointSize() / 2 + 3;
    ctx.save();
    ctx.scale(dpr, dpr);
    for (const ring of this.rings) {
      const [x, y] = this.dataToScreen(this.xy[2 * ring.i], this.xy[2 * ring.i + 1]);
      ctx.strokeStyle = ring.color;
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.arc(x, y, r, 0, 2 * Math.PI);
      ctx.stroke();
    }
    ctx.restore();
  }

  // The overlay's RGBA at CSS pixel (px, py) (the tests read the rings).
  readOverlayPixel(px, py) {
    const dpr = window.devicePixelRatio || 1;
    return Array.from(this.octx.getImageData(Math.floor(px * dpr), Math.floor(py * dpr), 1, 1).data);
  }

  // Called on every movement: frames use the sample until it settles.
  moving() {
    if (!this.lod) return;
    this.moveUntil = performance.now() + SETTLE_MS;
    clearTimeout(this.settleTimer);
    this.settleTimer = setTimeout(() => { this.moveUntil = 0; this.requestDraw(); }, SETTLE_MS + 5);
  }

  // Colours: RGBA bytes, 4n.
  setColors(rgba) {
    this.rgba = rgba;
    if (this.gl) {
      const gl = this.gl;
      gl.bindBuffer(gl.ARRAY_BUFFER, this.colBuf);
      gl.bufferData(gl.ARRAY_BUFFER, rgba, gl.DYNAMIC_DRAW);
    }
    if (this.lod) this.lodColors();
    this.requestDraw();
  }

  fit() {
    const b = this.bounds;
    const w = this.canvas.clientWidth || 1, h = this.canvas.clientHeight || 1;
    const sx = (b.x1 - b.x0) || 1, sy = (b.y1 - b.y0) || 1;
    this.view = { cx: (b.x0 + b.x1) / 2, cy: (b.y0 + b.y1) / 2, scale: 0.94 * Math.min(w / sx, h / sy) };
    this.fitScale = this.view.scale;
    this.requestDraw();
  }

  resize() {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(this.canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(this.canvas.clientHeight * dpr));
    for (const c of [this.canvas, this.overlay]) {
      if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
    }
    if (this.bounds && !this.userMoved) this.fit(); else this.requestDraw();
  }

  // CSS pixels (relative to the canvas) of a data point, and back.
  dataToScreen(x, y) {
    const v = this.view, w = this.canvas.clientWidth, h = this.canvas.clientHeight;
    return [(x - v.cx) * v.scale + w / 2, h / 2 - (y - v.cy) * v.scale];
  }

  screenToData(px, py) {
    const v = this.view, w = this.canvas.clientWidth, h = this.canvas.clientHeight;
    return [(px - w / 2) / v.scale + v.cx, (h / 2 - py) / v.scale + v.cy];
  }

  pointSize() {
    // Fewer cells get bigger dots; zooming in grows them a little.
    const base = this.n <= 5000 ? 5 : this.n <= 50000 ? 3.5 : this.n <= 300000 ? 2.5 : 1.8;
    const zoom = Math.max(1, Math.sqrt(this.view.scale / (this.fitScale || this.view.scale)));
    return Math.min(base * Math.min(zoom, 4), 24);
  }

  requestDraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  draw() {
    const all = this.xy && this.rgba ? this.n : 0;
    const sample = all && this.lod && this.lod.rgba && performance.now() < (this.moveUntil || 0);
    const order = !all ? null : sample ? this.lod.order : this.order;
    const n = !all ? 0 : order ? order.length : sample ? this.lod.idx.length : all;
    if (this.gl) this.drawGl(n, sample, order); else this.draw2d(n, sample, order);
    this.drawnPoints = n;
    this.frames++;
    if (!this.dragging) this.drawRings();
    if (this.onFrame) this.onFrame(n);
    if (this.onView) this.onView();
  }

  drawGl(n, sample, order) {
    const gl = this.gl, w = this.canvas.width, h = this.canvas.height, dpr = window.devicePixelRatio || 1;
    gl.viewport(0, 0, w, h);
    gl.clearColor(1, 1, 1, 1);
    gl.clear(gl.COLOR_BUFFER_BIT);
    if (!n) return;
    gl.useProgram(this.prog);
    gl.bindBuffer(gl.ARRAY_BUFFER, sample ? this.lodPosBuf : this.posBuf);
    gl.enableVertexAttribArray(this.loc.pos);
    gl.vertexAttribPointer(this.loc.pos, 2, gl.FLOAT, false, 0, 0);
    gl.bindBuffer(gl.ARRAY_BUFFER, sample ? this.lodColBuf : this.colBuf);
    gl.enableVertexAttribArray(this.loc.col);
    gl.vertexAttribPointer(this.loc.col, 4, gl.UNSIGNED_BYTE, true, 0, 0);
    const v = this.view;
    gl.uniform2f(this.loc.center, v.cx, v.cy);
    gl.uniform2f(this.loc.scale, (2 * v.scale * dpr) / w, (2 * v.scale * dpr) / h);
    gl.uniform1f(this.loc.size, Math.min(this.pointSize() * dpr, this.maxPoint));
    if (order && this.uintExt) {
      gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, sample ? this.lodIdxBuf : this.idxBuf);
      gl.drawElements(gl.POINTS, n, gl.UNSIGNED_INT, 0);
    } else {
      gl.drawArrays(gl.POINTS, 0, n);
    }
  }

  draw2d(n, sample, order) {
    const ctx = this.ctx, w = this.canvas.width, h = this.canvas.height, dpr = window.devicePixelRatio || 1;
    const img = ctx.createImageData(w, h);
    const px = new Uint32Array(img.data.buffer);
    px.fill(0xffffffff);
    const v = this.view, k = v.scale * dpr, ox = w / 2 - v.cx * k, oy = h / 2 + v.cy * k;
    const r = Math.max(1, Math.round(this.pointSize() * dpr / 2));
    const xy = sample ? this.lod.xy : this.xy, c = sample ? this.lod.rgba : this.rgba;
    // Little-endian RGBA bytes read as one 32-bit word: A B G R from the top.
    for (let j = 0; j < n; j++) {
      const i = order ? order[j] : j;
      const x = Math.round(xy[2 * i] * k + ox), y = Math.round(oy - xy[2 * i + 1] * k);
      if (x < -r || y < -r || x >= w + r || y >= h + r) continue;
      const word = (255 << 24 | c[4 * i + 2] << 16 | c[4 * i + 1] << 8 | c[4 * i]) >>> 0;
      for (let yy = Math.max(0, y - r + 1); yy <= Math.min(h - 1, y + r - 1); yy++) {
        const row = yy * w;
        for (let xx = Math.max(0, x - r + 1); xx <= Math.min(w - 1, x + r - 1); xx++) px[row + xx] = word;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // The drawn RGBA at CSS pixel (px, py) of the canvas (tests compare it
  // with a cell's colour at the cell's place).
  readPixel(px, py) {
    const dpr = window.devicePixelRatio || 1;
    const x = Math.floor(px * dpr), y = Math.floor(py * dpr);
    if (this.gl) {
      const out = new Uint8Array(4);
      this.gl.readPixels(x, this.canvas.height - 1 - y, 1, 1, this.gl.RGBA, this.gl.UNSIGNED_BYTE, out);
      return Array.from(out);
    }
    return Array.from(this.ctx.getImageData(x, y, 1, 1).data);
  }

  setMode(mode) {
    this.mode = mode;
    this.overlay.className = mode;
  }

  bindPointer() {
    const ov = this.overlay;
    let drag = null;
    const pos = (e) => { const r = ov.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    ov.addEventListener('pointerdown', (e) => {
      if (e.button !== 0) return;
      ov.setPointerCapture(e.pointerId);
      const p = pos(e);
      drag = { start: p, last: p, path: [p], view: { ...this.view }, moved: false };
      this.dragging = this.mode !== 'pan';
    });
    ov.addEventListener('pointermove', (e) => {
      const p = pos(e);
      if (!drag) {
        if (this.onHover && this.xy) this.onHover(this.screenToData(p[0], p[1]), p);
        return;
      }
      drag.last = p;
      if (Math.abs(p[0] - drag.start[0]) + Math.abs(p[1] - drag.start[1]) > 3) drag.moved = true;
      if (this.mode === 'pan') {
        if (!drag.moved) return;
        this.view.cx = drag.view.cx - (p[0] - drag.start[0]) / this.view.scale;
        this.view.cy = drag.view.cy + (p[1] - drag.start[1]) / this.view.scale;
        this.userMoved = true;
        this.moving();
        this.requestDraw();
      } else {
        if (this.mode === 'lasso') drag.path.push(p);
        this.drawShape(drag);
      }
    });
    const finish = (e) => {
      if (!drag) return;
      const d = drag;
      drag = null;
      if (e.type === 'pointerup') d.last = pos(e);
      this.dragging = false;
      this.drawRings();
      if (e.type === 'pointerup' && !d.moved && this.onClick) {
        this.onClick(this.screenToData(d.last[0], d.last[1]), d.last);
        return;
      }
      if (this.mode === 'box' && this.onSelect) {
        const [x0, y0] = this.screenToData(d.start[0], d.start[1]);
        const [x1, y1] = this.screenToData(d.last[0], d.last[1]);
        this.onSelect({ kind: 'box', x0: Math.min(x0, x1), x1: Math.max(x0, x1), y0: Math.min(y0, y1), y1: Math.max(y0, y1),
                        screen: [d.start, d.last] });
      } else if (this.mode === 'lasso' && this.onSelect && d.path.length > 2) {
        this.onSelect({ kind: 'lasso', points: d.path.map((p) => this.screenToData(p[0], p[1])) });
      }
    };
    ov.addEventListener('pointerleave', () => { if (!drag && this.onHover) this.onHover(null, null); });
    ov.addEventListener('pointerup', finish);
    ov.addEventListener('pointercancel', finish);
    ov.addEventListener('wheel', (e) => {
      e.preventDefault();
      const p = pos(e);
      const [dx, dy] = this.screenToData(p[0], p[1]);
      const f = Math.exp(-e.deltaY * 0.0015);
      this.view.scale = Math.min(Math.max(this.view.scale * f, (this.fitScale || 1) / 20), (this.fitScale || 1) * 2000);
      // Keep the data point under the cursor where it was.
      const [ax, ay] = this.screenToData(p[0], p[1]);
      this.view.cx += dx - ax;
      this.view.cy += dy - ay;
      this.userMoved = true;
      this.moving();
      this.requestDraw();
    }, { passive: false });
  }

  clearOverlay() {
    this.octx.clearRect(0, 0, this.overlay.width, this.overlay.height);
  }

  drawShape(d) {
    const ctx = this.octx, dpr = window.devicePixelRatio || 1;
    this.clearOverlay();
    ctx.save();
    ctx.scale(dpr, dpr);
    ctx.strokeStyle = '#2a64b8';
    ctx.fillStyle = 'rgba(42,100,184,0.08)';
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    if (this.mode === 'box') {
      ctx.rect(d.start[0], d.start[1], d.last[0] - d.start[0], d.last[1] - d.start[1]);
    } else {
      d.path.forEach((p, i) => (i ? ctx.lineTo(p[0], p[1]) : ctx.moveTo(p[0], p[1])));
      ctx.closePath();
    }
    ctx.fill();
    ctx.stroke();
    ctx.restore();
  }
}
