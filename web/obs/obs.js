// Chromeless player for an OBS Browser Source: the idol on a transparent canvas.
//   ?session=latest|ID   whose stream to show (WHEP viewer; default: the newest session)
//   ?own=1               open a session of its own instead (no mic; chat and MQTT drive it)
//   ?mode=auto|packed|chroma|plain  ?key=#00ff00 ?similarity=0.3 ?smoothness=0.1  ?audio=0  ?status=0
// mode=auto: transparent out of the box. As a WHEP viewer the page asks for the packed picture (colour | alpha)
// on its own track, whatever the session's own picture is; with ?key=… it keys out that colour instead; with
// ?own=1 it follows avatar.packed_alpha (its session's only picture).
import { api, newPeer, resolveSession, waitIceGathering, whepView } from "/web/shared/api.js";
import { AlphaRenderer, parseHexColour } from "/web/shared/packed.js";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const state = { conn: null, renderer: null, session: null, connected: false, attempts: 0 };
window.idolObs = state;

const status = (text) => { if (params.get("status") !== "0") $("status").textContent = text; };

function onTrack(track, stream) {
  if (track.kind === "audio") {
    if (params.get("audio") !== "0") $("audio").srcObject = stream || new MediaStream([track]);
  } else {
    $("video").srcObject = new MediaStream([track]);
  }
}

async function ownSession() {
  const pc = await newPeer();
  pc.addTransceiver("audio", { direction: "recvonly" });
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.ontrack = (e) => onTrack(e.track, e.streams[0]);
  await pc.setLocalDescription(await pc.createOffer());
  await waitIceGathering(pc);
  const answer = await api("/api/offer", { method: "POST", body: { sdp: pc.localDescription.sdp, type: "offer" } });
  await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
  return { pc, session: answer.session_id, close: async () => pc.close() };
}

async function connect() {
  try {
    status("connecting…");
    const options = await api("/api/surfaces/options");
    let mode = params.get("mode") || "auto";
    const own = params.get("own") === "1";
    if (mode === "auto") mode = params.has("key") ? "chroma" : (!own || options.packed_alpha) ? "packed" : "plain";
    if (!state.renderer) {
      state.renderer = new AlphaRenderer($("canvas"), $("video"), {
        mode,
        key: parseHexColour(params.get("key") || "#00ff00"),
        similarity: parseFloat(params.get("similarity") || "0.3"),
        smoothness: parseFloat(params.get("smoothness") || "0.1"),
      });
    }
    if (own) {
      state.conn = await ownSession();
      state.session = state.conn.session;
    } else {
      state.session = await resolveSession(params.get("session"));
      state.conn = await whepView(state.session, {
        onTrack,
        token: params.get("token") || undefined,
        alpha: mode === "packed" ? "packed" : undefined,
      });
    }
    const pc = state.conn.pc;
    pc.onconnectionstatechange = () => {
      state.connected = pc.connectionState === "connected";
      if (state.connected) { status(""); state.attempts = 0; }
      if (["failed", "closed", "disconnected"].includes(pc.connectionState)) retry(`connection ${pc.connectionState}`);
    };
  } catch (e) {
    retry(e.message);
  }
}

let retrying = false;
async function retry(why) {
  if (retrying) return;
  retrying = true;
  state.connected = false;
  if (state.conn) { await state.conn.close(); state.conn = null; }
  const wait = Math.min(10000, 1000 * 2 ** state.attempts++);
  status(`${why}; reconnecting in ${Math.round(wait / 1000)} s`);
  setTimeout(() => { retrying = false; connect(); }, wait);
}

connect();
