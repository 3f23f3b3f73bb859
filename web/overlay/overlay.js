// Overlay: chat feed + the idol's captions, each word highlighted when it is heard.
// Word times come from the caption events (session clock); /api/sessions/{id}/clock maps that clock
// to this page's clock, and the viewer's playout delay (?delay=ms, else the engine's default) is added.
import { eventSocket, resolveSession, SessionClock } from "/web/shared/api.js";

const params = new URLSearchParams(location.search);
const chatEl = document.getElementById("chat");
const capEl = document.getElementById("captions");
const maxChat = parseInt(getComputedStyle(document.documentElement).getPropertyValue("--chat-max-items")) || 8;
const state = { session: null, clock: null, words: [], highlights: [], turn: null, clearAt: null, seen: new Set() };
window.idolOverlay = state;
if (params.get("chat") === "0") chatEl.hidden = true;
if (params.get("captions") === "0") capEl.hidden = true;

function addChat(ev) {
  const div = document.createElement("div");
  div.className = `msg ${ev.role || "chat"}`;
  const user = document.createElement("span");
  user.className = "user";
  user.textContent = ev.user;
  div.append(user, document.createTextNode(ev.text));
  chatEl.append(div);
  while (chatEl.children.length > maxChat) chatEl.firstElementChild.remove();
}

function addCaption(ev) {
  const key = `${ev.turn_id}/${ev.index}`;
  if (state.seen.has(key)) return; // announced ahead (caption_scheduled), then again at playback (caption)
  state.seen.add(key);
  if (state.seen.size > 500) state.seen = new Set([key]);
  if (state.turn !== ev.turn_id) { capEl.textContent = ""; state.words = []; state.turn = ev.turn_id; }
  const line = document.createElement("span");
  line.className = "line";
  const words = ev.words && ev.words.length ? ev.words : [{ w: ev.text, start: ev.t, end: ev.t + ev.duration }];
  words.forEach((w, i) => {
    const span = document.createElement("span");
    span.className = "w";
    span.textContent = w.w;
    line.append(span, document.createTextNode(i < words.length - 1 ? " " : ""));
    state.words.push({ el: span, w: w.w, start: w.start, end: w.end, done: false, first: i === 0 });
  });
  if (capEl.childNodes.length) capEl.append(document.createTextNode(" "));
  capEl.append(line);
  state.clearAt = null;
}

function tick() {
  if (state.clock) {
    const now = performance.now();
    for (const w of state.words) {
      const start = state.clock.pageMs(w.start);
      const end = state.clock.pageMs(w.end);
      const current = now >= start && now < end;
      w.el.classList.toggle("current", current);
      if (now >= start && !w.done) {
        w.done = true;
        w.el.classList.add("spoken");
        state.highlights.push({
          w: w.w, start: w.start, first: w.first, at: (now - state.clock.offsetMs - state.clock.delayMs) / 1000,
        });
      }
    }
    const last = state.words[state.words.length - 1];
    if (last && last.done && state.clearAt === null) state.clearAt = state.clock.pageMs(last.end) + 4000;
    if (state.clearAt !== null && now > state.clearAt) { capEl.textContent = ""; state.words = []; state.clearAt = null; }
  }
  requestAnimationFrame(tick);
}

async function connect() {
  try {
    state.session = await resolveSession(params.get("session"));
    state.clock = await new SessionClock(state.session).sync();
    if (params.has("delay")) state.clock.delayMs = parseFloat(params.get("delay"));
    eventSocket(state.session, (ev) => {
      if (ev.type === "chat") addChat(ev);
      else if (ev.type === "caption" || ev.type === "caption_scheduled") addCaption(ev);
      else if (ev.type === "interrupted") for (const w of state.words) if (!w.done) w.el.remove();
    }, () => setTimeout(connect, 2000));
    state.connected = true;
  } catch (e) {
    state.connected = false;
    setTimeout(connect, 2000);
  }
}
connect();
requestAnimationFrame(tick);
