// The host console: mic in (meter, mute, push-to-talk), the idol out (preview, captions), controls, latency.
import { api, eventSocket, newPeer, waitIceGathering } from "/web/shared/api.js";
import { AlphaRenderer } from "/web/shared/packed.js";

const $ = (id) => document.getElementById(id);
const state = { pc: null, ws: null, mic: null, session: null, audioCtx: null, options: null, renderer: null, captionTurn: null };
window.idolConsole = state; // for tests and debugging

function showError(message) {
  $("error-text").textContent = message || "";
  $("error").hidden = !message;
}
$("error-clear").onclick = () => showError("");

function setConn(s) {
  $("conn-state").textContent = s;
  $("conn-state").dataset.state = s;
}

const live = ["disconnect", "mute", "ptt-mode", "interrupt", "expression", "gesture", "profile", "persona", "persona-set", "say-text", "say-send"];
function setLive(on) {
  for (const id of live) $(id).disabled = !on;
  $("connect").disabled = on;
  $("ptt").disabled = !on || !$("ptt-mode").checked;
}

async function checkEngine() {
  try {
    const h = await api("/api/health");
    const pct = h.fraction != null ? ` ${Math.round(h.fraction * 100)}%` : "";
    $("engine-status").textContent = h.state === "ready" ? "engine ready" : h.state === "failed" ? `engine failed: ${h.error}` : `loading: ${h.message}${pct}`;
    if (h.state === "failed") showError(`The engine failed to load: ${h.error}`);
    if (h.state === "loading") setTimeout(checkEngine, 1000);
  } catch (e) {
    $("engine-status").textContent = "engine unreachable";
    setTimeout(checkEngine, 2000);
  }
}

async function loadOptions() {
  state.options = await api("/api/surfaces/options");
  const fill = (id, names) => { for (const n of names) $(id).append(new Option(n, n)); };
  fill("expression", state.options.expressions);
  fill("gesture", state.options.gestures);
  fill("profile", state.options.profiles);
}

// ---- mic: level meter, mute, push-to-talk -------------------------------------------------------
function startMeter(stream) {
  state.audioCtx = new AudioContext();
  const src = state.audioCtx.createMediaStreamSource(stream);
  const an = state.audioCtx.createAnalyser();
  an.fftSize = 1024;
  src.connect(an);
  const buf = new Float32Array(an.fftSize);
  const tick = () => {
    if (!state.audioCtx) return;
    an.getFloatTimeDomainData(buf);
    let sum = 0;
    for (const v of buf) sum += v * v;
    const rms = Math.sqrt(sum / buf.length);
    const track = state.mic && state.mic.getAudioTracks()[0];
    $("mic-level").value = track && track.enabled ? Math.min(1, rms * 4) : 0;
    requestAnimationFrame(tick);
  };
  tick();
}

function micEnabled(on) {
  if (!state.mic) return;
  for (const t of state.mic.getAudioTracks()) t.enabled = on;
  $("mic-state").textContent = on ? "live" : "muted";
  $("mute").setAttribute("aria-pressed", String(!on && !$("ptt-mode").checked));
}
$("mute").onclick = () => { const t = state.mic.getAudioTracks()[0]; micEnabled(!t.enabled); $("mute").textContent = t.enabled ? "Mute" : "Unmute"; };
$("ptt-mode").onchange = () => { $("ptt").disabled = !$("ptt-mode").checked; micEnabled(!$("ptt-mode").checked); };
const ptt = (on) => { if ($("ptt-mode").checked && state.mic) micEnabled(on); };
$("ptt").onpointerdown = () => ptt(true);
$("ptt").onpointerup = $("ptt").onpointerleave = () => ptt(false);
addEventListener("keydown", (e) => { if (e.code === "Space" && e.target === document.body) { e.preventDefault(); ptt(true); } });
addEventListener("keyup", (e) => { if (e.code === "Space" && e.target === document.body) ptt(false); });

// ---- events ----------------------------------------------------------------------------------------
function addLine(cls, text) {
  const li = document.createElement("li");
  li.className = cls;
  li.textContent = text;
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function onEvent(ev) {
  switch (ev.type) {
    case "partial": $("partial").textContent = ev.text; break;
    case "final":
      if (!ev.text) {
        $("partial").textContent = "";
        if (ev.unanswered) addLine("system", "(heard speech, no words: say it again?)");
      }
      break;
    case "user_turn": {
      $("partial").textContent = "";
      // the host went on talking: this turn repeats the words of the one it continues
      if (ev.continues != null) document.querySelector(`#transcript li.host[data-turn="${ev.continues}"]`)?.remove();
      const li = addLine(ev.source === "chat" ? "chat" : "host", ev.source === "chat" ? `${ev.speaker}: ${ev.text}` : ev.text);
      li.dataset.turn = ev.turn_id;
      break;
    }
    case "caption":
      if (state.captionTurn !== ev.turn_id) { $("captions").textContent = ""; state.captionTurn = ev.turn_id; }
      $("captions").textContent += ($("captions").textContent ? " " : "") + ev.text;
      break;
    case "turn_completed": {
      if (!ev.continued || ev.played_text) {
        const li = addLine("idol", ev.played_text || "…");
        if (ev.interrupted) li.classList.add("interrupted");
      }
      const r = ev.timings.relative_ms || {};
      const row = document.createElement("tr");
      row.dataset.turn = ev.turn_id;
      for (const v of [ev.turn_id, ev.timings.source, r.asr_final, r.llm_first_token, r.first_chunk_text, r.tts_first_audio, r.first_audio_sent]) {
        const td = document.createElement("td");
        td.textContent = v == null ? "–" : typeof v === "number" ? Math.round(v) : v;
        row.append(td);
      }
      $("latency").tBodies[0].prepend(row);
      break;
    }
    case "interrupted": addLine("idol interrupted", `(interrupted: ${ev.reason})`); break;
    case "error": showError(`${ev.stage} failed: ${ev.message}`); break;
    case "connection": setConn(ev.state); break;
    case "rtmp": if (ev.state === "reconnecting") showError(`RTMP reconnecting: ${ev.error}`); break;
  }
}

// ---- connect / disconnect ----------------------------------------------------------------------------
function showVideo(track) {
  const video = $("idol-video");
  video.srcObject = new MediaStream([track]);
  $("no-video").hidden = true;
  if (state.options && state.options.packed_alpha) {
    video.hidden = true;
    $("idol-canvas").hidden = false;
    state.renderer = new AlphaRenderer($("idol-canvas"), video, { mode: "packed" });
  }
}

async function connect() {
  showError("");
  $("connect").disabled = true;
  setConn("connecting");
  try {
    if (!navigator.mediaDevices) throw new Error("no microphone access: open the console from http://localhost or https");
    state.mic = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
    startMeter(state.mic);
    const pc = (state.pc = await newPeer());
    for (const track of state.mic.getTracks()) pc.addTrack(track, state.mic);
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.ontrack = (e) => {
      if (e.track.kind === "audio") $("idol-audio").srcObject = e.streams[0] || new MediaStream([e.track]);
      else e.track.onunmute = () => showVideo(e.track);
    };
    pc.onconnectionstatechange = () => {
      setConn(pc.connectionState);
      if (pc.connectionState === "failed") showError("WebRTC connection failed: are UDP ports blocked? Configure server.ice_servers (TURN).");
    };
    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc);
    const answer = await api("/api/offer", { method: "POST", body: { sdp: pc.localDescription.sdp, type: "offer" } });
    state.session = answer.session_id;
    $("session-id").textContent = `session ${state.session}`;
    await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    state.ws = eventSocket(state.session, onEvent, () => { if (state.session) showError("The event stream closed."); });
    micEnabled(!$("ptt-mode").checked);
    setLive(true);
  } catch (e) {
    showError(`Could not connect: ${e.message}`);
    await disconnect(false);
  }
}

async function disconnect(closeSession = true) {
  const session = state.session;
  state.session = null;
  if (state.ws) state.ws.close();
  if (state.pc) state.pc.close();
  if (state.mic) for (const t of state.mic.getTracks()) t.stop();
  if (state.audioCtx) state.audioCtx.close();
  if (state.renderer) state.renderer.stop();
  Object.assign(state, { ws: null, pc: null, mic: null, audioCtx: null, renderer: null });
  if (closeSession && session) { try { await api(`/api/sessions/${session}`, { method: "DELETE" }); } catch {} }
  $("mic-level").value = 0;
  $("mic-state").textContent = "off";
  $("session-id").textContent = "";
  setConn("disconnected");
  setLive(false);
}

async function post(path, body) {
  try { return await api(`/api/sessions/${state.session}/${path}`, { method: "POST", body: body || {} }); }
  catch (e) { showError(e.message); }
}

$("connect").onclick = connect;
$("disconnect").onclick = () => disconnect(true);
$("interrupt").onclick = () => post("interrupt");
for (const kind of ["expression", "gesture", "profile"]) {
  $(kind).onchange = async () => { if ($(kind).value) await post(kind, { name: $(kind).value }); $(kind).value = ""; };
}
$("persona-set").onclick = () => { const n = $("persona").value.trim(); if (n) post("persona", { name: n }); };
$("say-form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("say-text").value.trim();
  if (text) post("say", { text });
  $("say-text").value = "";
};
setLive(false);
checkEngine();
loadOptions().catch((e) => showError(`Could not load options: ${e.message}`));
