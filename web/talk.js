// Minimal talk page: mic in, the idol's voice out, transcript and per-turn latency.
const $ = (id) => document.getElementById(id);
let pc = null;
let sessionId = null;
let ws = null;

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = !message;
}

async function checkEngine() {
  try {
    const r = await fetch("/api/health");
    const h = await r.json();
    const pct = h.fraction != null ? ` ${Math.round(h.fraction * 100)}%` : "";
    $("engine-status").textContent =
      h.state === "ready" ? "engine ready" : h.state === "failed" ? `engine failed: ${h.error}` : `loading: ${h.message}${pct}`;
    $("connect").disabled = h.state !== "ready" && !pc;
    if (h.state === "loading") setTimeout(checkEngine, 1000);
  } catch (e) {
    $("engine-status").textContent = "engine unreachable";
    setTimeout(checkEngine, 2000);
  }
}

function addLog(cls, text, id) {
  const li = document.createElement("li");
  li.className = cls;
  li.textContent = text;
  if (id) li.dataset.turn = id;
  $("log").appendChild(li);
  return li;
}

function onEvent(ev) {
  switch (ev.type) {
    case "partial": $("partial").textContent = ev.text; break;
    case "user_turn": $("partial").textContent = ""; addLog("host", ev.text); break;
    case "turn_completed": {
      const li = addLog("idol", ev.played_text || "…", ev.turn_id);
      if (ev.interrupted) li.classList.add("interrupted");
      const r = ev.timings.relative_ms;
      const row = document.createElement("tr");
      for (const v of [ev.turn_id, r.asr_final, r.llm_first_token, r.first_chunk_text, r.tts_first_audio, r.first_audio_sent]) {
        const td = document.createElement("td");
        td.textContent = v == null ? "–" : Math.round(v);
        row.appendChild(td);
      }
      $("latency").querySelector("tbody").appendChild(row);
      break;
    }
    case "error": showError(`${ev.stage} failed: ${ev.message}`); break;
    case "connection": $("conn-state").textContent = ev.state; break;
  }
}

async function connect() {
  showError("");
  $("connect").disabled = true;
  try {
    const mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    const ice = await fetch("/api/ice-servers").then((r) => (r.ok ? r.json() : {})).catch(() => ({}));
    pc = new RTCPeerConnection({ iceServers: ice.iceServers || [] });
    for (const track of mic.getTracks()) pc.addTrack(track, mic);
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.ontrack = (e) => {
      if (e.track.kind === "audio") $("idol-audio").srcObject = e.streams[0] || new MediaStream([e.track]);
      else { $("idol-video").srcObject = new MediaStream([e.track]); $("idol-video").hidden = false; }
    };
    pc.onconnectionstatechange = () => {
      $("conn-state").textContent = pc.connectionState;
      if (pc.connectionState === "failed") showError("WebRTC connection failed: are UDP ports blocked? Configure server.ice_servers (TURN).");
    };
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise((resolve) => {
      if (pc.iceGatheringState === "complete") return resolve();
      pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && resolve();
      setTimeout(resolve, 3000);
    });
    const r = await fetch("/api/offer", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
    });
    const answer = await r.json();
    if (!r.ok) throw new Error(answer.error || `offer refused (${r.status})`);
    sessionId = answer.session_id;
    window.idolSessionId = sessionId;
    await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/sessions/${sessionId}/events`);
    ws.onmessage = (m) => onEvent(JSON.parse(m.data));
    for (const id of ["interrupt", "say-text", "say-send"]) $(id).disabled = false;
  } catch (e) {
    showError(`Could not connect: ${e.message}`);
    $("connect").disabled = false;
  }
}

async function post(path, body) {
  const r = await fetch(`/api/sessions/${sessionId}/${path}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
  });
  if (!r.ok) showError((await r.json()).error || `request failed (${r.status})`);
}

$("connect").onclick = connect;
$("interrupt").onclick = () => post("interrupt");
$("say-form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("say-text").value.trim();
  if (text) post("say", { text });
  $("say-text").value = "";
};
checkEngine();
