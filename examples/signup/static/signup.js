// The sign-up page. A token is fetched when the page opens, the button
// cannot fire twice, and every resend reuses the token. A sign-up without
// its answer is kept in localStorage and resent, with its token, a second
// after a failure, every few seconds, when the network comes back, and when
// the page opens again. Requests go through request() of /kit/panel.js, which
// shows them in the panel.
import { request, whenOnline, isOffline, showRows, OfflineError } from "/kit/panel.js";

const user = new URLSearchParams(location.search).get("user") || "1";
const asUser = { "X-User": user }; // the demo's authentication
const PENDING = "signup-pending-" + user;
const button = document.getElementById("submit");
const status = document.getElementById("status");
const $ = (id) => document.getElementById(id);

let token = null; // one per page: fetched at open, reused by every resend
let activityId = null;
let waiting = false; // this page has a sign-up without its answer
let sending = false; // a request is on its way
let renewed = false; // the token was replaced once after a refusal

function show(text, state) {
  status.textContent = text;
  status.dataset.state = state;
}

// keep marks the sign-up as waiting for its answer, here and in
// localStorage, where a reload finds it.
function keep() {
  waiting = true;
  try {
    localStorage.setItem(PENDING, JSON.stringify({ token, activityId }));
  } catch {
    // Storage full or forbidden: send anyway.
  }
}

function loadPending() {
  try {
    return JSON.parse(localStorage.getItem(PENDING));
  } catch {
    return null;
  }
}

function forgetPending() {
  try {
    localStorage.removeItem(PENDING);
  } catch {
    // Storage forbidden: nothing was kept.
  }
}

// settle forgets the sign-up after a definite answer: here, and in
// localStorage unless another tab of the same user has put its own there.
function settle() {
  waiting = false;
  if (loadPending()?.token === token) forgetPending();
}

const day = new Intl.DateTimeFormat(undefined, { weekday: "short", day: "numeric", month: "short" });
const time = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" });

// fact fills one of the activity's facts: a main line and a smaller one.
function fact(id, main, sub) {
  const small = document.createElement("small");
  small.textContent = sub;
  $(id).replaceChildren(main, small);
}

// refresh asks the server for the activity, who is signed in and their
// sign-up, shows them, and returns the answer.
async function refresh() {
  const res = await request("/api/activity", { headers: asUser });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.detail || res.statusText);
  const a = data.activity;
  activityId = a.id;
  $("title").textContent = a.title;
  document.title = a.title + " · Riverside Runners";
  const [place, spot = ""] = a.place.split(", ");
  fact("when", day.format(new Date(a.startsAt)), time.format(new Date(a.startsAt)));
  fact("where", place, spot);
  fact("seats", `${a.seatsLeft} left`, `of ${a.seats}`);
  $("meter").style.setProperty("--taken", String((a.seats - a.seatsLeft) / a.seats));
  $("meter").setAttribute("aria-label", `${a.seats - a.seatsLeft} of ${a.seats} seats taken`);
  $("who").dataset.known = String(data.user != null);
  if (data.user) {
    $("avatar").textContent = data.user.name.split(" ").map((w) => w[0]).join("").slice(0, 2);
    $("who-text").replaceChildren("Signed in as ", strong(data.user.name));
    showRows(data.rows);
  } else {
    $("avatar").textContent = "?";
    $("who-text").textContent = "Not signed in";
  }
  return data;
}

function strong(text) {
  const el = document.createElement("strong");
  el.textContent = text;
  return el;
}

// unknownUser explains why nobody can sign up from this page.
function unknownUser() {
  button.disabled = true;
  status.replaceChildren(
    `We don't know user “${user}”, so you cannot sign up. This demo has users 1 to 5: `,
    link("?user=1", "open the page as user 1"), ".",
  );
  status.dataset.state = "unauthorized";
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function signedUp(text, state) {
  button.disabled = true;
  button.textContent = "Signed up ✓";
  show(text, state);
}

async function newToken() {
  const res = await request("/api/idem-token", { headers: asUser });
  const data = await res.json().catch(() => ({}));
  if (res.status === 401) return false;
  if (!res.ok) throw new Error(data.detail || res.statusText);
  token = data.token;
  return true;
}

async function open() {
  const data = await refresh();
  if (!data.user) return unknownUser();
  let p = loadPending();
  if (p && p.activityId !== activityId) {
    // A sign-up to an activity this page no longer shows (an earlier start
    // of the example made it): not this page's to finish.
    forgetPending();
    p = null;
  }
  if (data.signupId != null) {
    // Signed up already, on this page before a reload or on another
    // device: say so, whatever is pending.
    forgetPending();
    return signedUp(`You are signed up for this run (sign-up #${data.signupId}).`, "signed-up");
  }
  if (p?.token) {
    token = p.token; // a sign-up that never got its answer: finish it
    waiting = true;
    button.disabled = true;
    show("Finishing your earlier sign-up…", "sending");
    return deliver();
  }
  if (data.activity.seatsLeft <= 0) return show("Sorry, every seat is taken.", "full");
  if (!(await newToken())) return unknownUser();
  button.disabled = false;
  show("Ready when you are.", "ready");
}

function submit() {
  if (sending || !token) return; // a double click does nothing
  button.disabled = true;
  renewed = false;
  keep();
  deliver();
}

// deliver sends the waiting sign-up once. Without an answer it keeps
// waiting, to be resent with the same token.
async function deliver() {
  if (sending) return;
  sending = true;
  try {
    show("Signing you up…", "sending");
    let res;
    try {
      res = await request("/api/signup", {
        method: "POST",
        key: token,
        headers: { ...asUser, "Content-Type": "application/json" },
        body: JSON.stringify({ activityId }),
        timeout: 4000,
      });
    } catch (e) {
      // Offline, a timeout, a dropped connection: the sign-up may well
      // have happened. Keep it; the resend carries the same token, and the
      // server answers a repeat from its record.
      if (e instanceof OfflineError) {
        show("You are offline. Your sign-up is kept and will be sent when you are back online.", "pending");
      } else {
        show("No answer from the server: resending with the same key…", "pending");
        setTimeout(resend, 1000);
      }
      return;
    }
    const data = await res.json().catch(() => ({}));
    if (res.status === 409 || res.status === 429 || res.status >= 500) {
      // In progress, throttled, or a server hiccup: nothing was recorded
      // for this answer; same token, a little later.
      show(res.status === 409 ? "Your sign-up is being processed…" : "The server is busy; resending shortly…", "in-progress");
      return;
    }
    if (res.status === 400 && data.code === "token-rejected" && !renewed) {
      // The token expired (or was never valid): it never ran, so a new one
      // is safe.
      renewed = true;
      if (await newToken()) {
        keep();
        sending = false;
        return await deliver(); // awaited, so that the finally below runs after it
      }
    }
    settle(); // a definite answer
    const replayed = res.headers.get("Idempotent-Replayed") === "true";
    if (res.ok && data.ok) {
      if (data.already) signedUp("You were already signed up (from another tab or device): one seat is yours.", "already");
      else if (replayed) signedUp(data.message + " The first answer was lost on the way; this one is the server's record of it, so you were signed up once.", "done");
      else signedUp(data.message, "done");
      await refresh().catch(() => {});
      return;
    }
    if (res.status === 401) return unknownUser();
    // Refused for good (a full activity, say): this token is spent.
    show(data.detail || data.message || "The sign-up was refused.", data.code === "activity-full" ? "full" : "error");
    if (data.code !== "activity-full" && (await newToken())) button.disabled = false;
  } finally {
    sending = false;
  }
}

// resend sends this page's waiting sign-up again, with its token.
function resend() {
  if (waiting && !sending && !isOffline()) deliver();
}

button.addEventListener("click", submit);
whenOnline(resend);
setInterval(resend, 2000);
open().catch(() => show("The server cannot be reached. Reload the page to try again.", "error"));
