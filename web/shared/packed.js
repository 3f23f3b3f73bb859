// Draws a <video> on a transparent WebGL canvas: packed alpha (colour | alpha side by side),
// chroma key, or plain. Used by the OBS page and the console preview.

const VS = `attribute vec2 p; varying vec2 uv;
void main() { uv = vec2(p.x * 0.5 + 0.5, 0.5 - p.y * 0.5); gl_Position = vec4(p, 0.0, 1.0); }`;
const FS = `precision mediump float; varying vec2 uv; uniform sampler2D tex;
uniform int mode; uniform vec3 key; uniform float similarity; uniform float smoothness;
void main() {
  if (mode == 1) {            // packed alpha: left half colour, right half alpha as grey
    vec3 c = texture2D(tex, vec2(uv.x * 0.5, uv.y)).rgb;
    float a = texture2D(tex, vec2(0.5 + uv.x * 0.5, uv.y)).r;
    gl_FragColor = vec4(c * a, a);   // premultiplied
  } else if (mode == 2) {     // chroma key
    vec3 c = texture2D(tex, uv).rgb;
    float d = distance(c, key);
    float a = smoothstep(similarity, similarity + smoothness, d);
    gl_FragColor = vec4(c * a, a);
  } else {
    gl_FragColor = vec4(texture2D(tex, uv).rgb, 1.0);
  }
}`;

export class AlphaRenderer {
  constructor(canvas, video, { mode = "packed", key = [0, 1, 0], similarity = 0.3, smoothness = 0.1 } = {}) {
    this.canvas = canvas; this.video = video; this.opts = { mode, key, similarity, smoothness };
    const gl = canvas.getContext("webgl", { premultipliedAlpha: true, alpha: true });
    if (!gl) throw new Error("WebGL is not available");
    this.gl = gl;
    const prog = gl.createProgram();
    for (const [type, src] of [[gl.VERTEX_SHADER, VS], [gl.FRAGMENT_SHADER, FS]]) {
      const s = gl.createShader(type); gl.shaderSource(s, src); gl.compileShader(s);
      if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
      gl.attachShader(prog, s);
    }
    gl.linkProgram(prog); gl.useProgram(prog);
    const buf = gl.createBuffer(); gl.bindBuffer(gl.ARRAY_BUFFER, buf);
    gl.bufferData(gl.ARRAY_BUFFER, new Float32Array([-1, -1, 1, -1, -1, 1, 1, 1]), gl.STATIC_DRAW);
    const loc = gl.getAttribLocation(prog, "p"); gl.enableVertexAttribArray(loc);
    gl.vertexAttribPointer(loc, 2, gl.FLOAT, false, 0, 0);
    gl.bindTexture(gl.TEXTURE_2D, gl.createTexture());
    for (const [k, v] of [[gl.TEXTURE_MIN_FILTER, gl.LINEAR], [gl.TEXTURE_MAG_FILTER, gl.LINEAR],
      [gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE], [gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE]]) gl.texParameteri(gl.TEXTURE_2D, k, v);
    this.u = Object.fromEntries(["mode", "key", "similarity", "smoothness"].map((n) => [n, gl.getUniformLocation(prog, n)]));
    this.frames = 0; this.running = true;
    const tick = () => { if (!this.running) return; this.draw(); requestAnimationFrame(tick); };
    requestAnimationFrame(tick);
  }
  draw() {
    const { gl, video, canvas, opts } = this;
    if (video.readyState < 2 || !video.videoWidth) { gl.clearColor(0, 0, 0, 0); gl.clear(gl.COLOR_BUFFER_BIT); return; }
    const w = opts.mode === "packed" ? video.videoWidth / 2 : video.videoWidth;
    if (canvas.width !== w || canvas.height !== video.videoHeight) { canvas.width = w; canvas.height = video.videoHeight; }
    gl.viewport(0, 0, canvas.width, canvas.height);
    gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, gl.RGBA, gl.UNSIGNED_BYTE, video);
    gl.uniform1i(this.u.mode, { plain: 0, packed: 1, chroma: 2 }[opts.mode] ?? 0);
    gl.uniform3fv(this.u.key, opts.key); gl.uniform1f(this.u.similarity, opts.similarity);
    gl.uniform1f(this.u.smoothness, opts.smoothness);
    gl.clearColor(0, 0, 0, 0); gl.clear(gl.COLOR_BUFFER_BIT);
    gl.drawArrays(gl.TRIANGLE_STRIP, 0, 4);
    this.frames++;
  }
  stop() { this.running = false; }
}

export function parseHexColour(hex) {
  const h = hex.replace("#", "");
  return [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16) / 255);
}
