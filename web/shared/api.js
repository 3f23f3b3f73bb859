// Shared helpers of the idolcast pages: JSON API, WHEP viewer, event socket, session-clock sync.

// The page's credential. Opened from this machine, the page came with a same-origin cookie (the
// console: host; OBS and overlay: viewer). Elsewhere, give a token in the address (#token=… keeps it
// off the server's and OBS's logs; ?token=… also works): it is traded once for the same cookie
// (HttpOnly, SameSite=Strict) and taken out of the address.
export async function authorize() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const query = new URLSearchParams(location.search);
  const token = hash.get("token") || query.get("token");
  if (!token) return;
  const r = await fetch("/api/auth/session", {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: "{}",
  });
  if (!r.ok) console.warn(`idolcast: the token in the address was refused (${r.status})`);
  hash.delete("token");
  query.delete("token");
  const q = query.toString(), h = hash.toString();
  history.replaceState(null, "", `${location.pathname}${q ? `?${q}` : ""}${h ? `#${h}` : ""}`);
}
await authorize();

export async function api(path, { method = "GET", body } = {}) {
  const r = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = {};
  try { data = text ? JSON.parse(text) : {}; } catch { data = { error: text }; }
  if (!r.ok) throw new Error(data.error || `${method} ${path} failed (${r.status})`);
  return data;
}

// The STUN/TURN servers of the engine (server.ice_servers, TURN credentials included), for every
// peer a page makes: GET /api/ice-servers; none where that is refused (a viewer token).
let iceServerList;
export async function iceServers() {
  if (iceServerList === undefined) {
    try { iceServerList = (await api("/api/ice-servers")).iceServers || []; } catch { iceServerList = []; }
  }
  return iceServerList;
}

export async function newPeer() {
  return new RTCPeerConnection({ iceServers: await iceServers() });
}

export function waitIceGathering(pc, ms = 3000) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const done = () => pc.iceGatheringState === "complete" && resolve();
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ms);
  });
}

// WHEP (draft-ietf-wish-whep): POST an offer as application/sdp, 201 + Location, DELETE to end.
export async function whepView(session, { onTrack, token, alpha } = {}) {
  const pc = await newPeer();
  pc.addTransceiver("audio", { direction: "recvonly" });
  pc.addTransceiver("video", { direction: "recvonly" });
  pc.ontrack = (e) => onTrack && onTrack(e.track, e.streams[0]);
  await pc.setLocalDescription(await pc.createOffer());
  await waitIceGathering(pc);
  const headers = { "Content-Type": "application/sdp" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const query = alpha ? `?alpha=${encodeURIComponent(alpha)}` : "";
  const r = await fetch(`/api/sessions/${session}/whep${query}`, { method: "POST", headers, body: pc.localDescription.sdp });
  if (r.status !== 201) {
    pc.close();
    let msg = `WHEP refused (${r.status})`;
    try { msg = (await r.json()).error || msg; } catch {}
    throw new Error(msg);
  }
  const resource = r.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: await r.text() });
  return {
    pc,
    resource,
    close: async () => {
      pc.close();
      try { await fetch(resource, { method: "DELETE" }); } catch {}
    },
  };
}

// The session's event socket; calls onEvent for each event, onClose when it ends.
export function eventSocket(session, onEvent, onClose) {
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/api/sessions/${session}/events`);
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = () => onClose && onClose();
  return ws;
}

// Maps session-clock seconds to this page's performance.now() milliseconds (NTP-style, best of N).
export class SessionClock {
  constructor(session) { this.session = session; this.offsetMs = null; this.delayMs = 0; this.rttMs = Infinity; }
  async sync(rounds = 5) {
    for (let i = 0; i < rounds; i++) {
      const t0 = performance.now();
      const c = await api(`/api/sessions/${this.session}/clock`);
      const t1 = performance.now();
      if (t1 - t0 < this.rttMs) {
        this.rttMs = t1 - t0;
        this.offsetMs = (t0 + t1) / 2 - c.now * 1000;
      }
      this.delayMs = c.playout_delay_ms;
    }
    return this;
  }
  // when a session-clock time is heard on this page (the viewer's playout delay included)
  pageMs(t) { return t * 1000 + this.offsetMs + this.delayMs; }
  sessionNow() { return (performance.now() - this.offsetMs) / 1000; }
}

export async function resolveSession(wanted) {
  if (wanted && wanted !== "latest") return wanted;
  const { sessions } = await api("/api/streams");
  const live = sessions.find((s) => s.connected);  // "latest": the newest connected host session
  if (!live) throw new Error("no session is running yet");
  return live.id;
}
