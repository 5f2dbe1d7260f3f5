// The approvals inbox. Every value of a call is a model's output: it is put
// in the page as text (textContent, text nodes), never as HTML.

const $ = (id) => document.getElementById(id);

const state = {
  me: null, // {name, groups, csrf, operator}
  offset: 0, // the server's clock minus ours, in ms
  cards: new Map(), // key -> the pending call's card
  events: null,
  refreshing: null,
  again: false,
  more: 0, // pending calls the server did not list
};

// el makes an element; children are elements or strings (text).
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('data-') || ['type', 'title', 'maxlength', 'rows', 'role'].includes(k)) e.setAttribute(k, String(v));
    else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && state.me) headers['X-Toolq-Csrf'] = state.me.csrf;
  const res = await fetch(path, {
    method, headers, credentials: 'same-origin', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  if (res.status !== 204) {
    try { data = await res.json(); } catch { /* not JSON */ }
  }
  if (!res.ok) throw new APIError(res.status, data?.error?.code ?? '', data?.error?.message ?? res.statusText);
  return data;
}

function notice(text) { $('notice').textContent = text; }

// --- session ---------------------------------------------------------------

async function boot() {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', logout);
  $('tab-pending').addEventListener('click', () => tab('pending'));
  $('tab-history').addEventListener('click', () => tab('history'));
  setInterval(tick, 1000);
  setInterval(() => { if (state.me) refresh(); }, 30000);
  try {
    start(await api('api/session'));
  } catch (err) {
    if (err.status === 401) showLogin();
    else notice('The inbox did not answer: ' + err.message);
  }
}

function showLogin(message = '') {
  state.me = null;
  if (state.events) state.events.close();
  state.events = null;
  for (const card of state.cards.values()) card.remove();
  state.cards.clear();
  $('inbox').hidden = true;
  $('who').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message;
  $('live').textContent = '';
  $('token').focus();
}

async function login(ev) {
  ev.preventDefault();
  const token = $('token').value;
  $('login-submit').disabled = true;
  try {
    const me = await api('api/login', { method: 'POST', body: { token } });
    $('token').value = '';
    start(me);
  } catch (err) {
    $('login-error').textContent = err.message;
  } finally {
    $('login-submit').disabled = false;
  }
}

async function logout() {
  try { await api('api/logout', { method: 'POST' }); } catch { /* logged out either way */ }
  showLogin();
}

function start(me) {
  state.me = me;
  $('login').hidden = true;
  $('inbox').hidden = false;
  $('who').hidden = false;
  $('who-name').textContent = me.operator ? `acting as ${me.name} (this machine only)` : me.name;
  $('who-groups').textContent = 'approves for ' + me.groups.join(', ');
  $('logout').hidden = me.operator;
  listen();
  refresh();
}

function tab(which) {
  $('pending-view').hidden = which !== 'pending';
  $('history-view').hidden = which !== 'history';
  $('tab-pending').setAttribute('aria-selected', String(which === 'pending'));
  $('tab-history').setAttribute('aria-selected', String(which === 'history'));
}

// --- live updates ----------------------------------------------------------

function listen() {
  if (state.events) state.events.close();
  const es = new EventSource('api/events');
  state.events = es;
  es.addEventListener('open', () => {
    $('live').textContent = 'live';
    $('live').classList.add('on');
    refresh(); // whatever happened while the stream was down
  });
  es.addEventListener('change', () => refresh());
  es.addEventListener('error', () => {
    $('live').textContent = 'reconnecting…';
    $('live').classList.remove('on');
    if (es.readyState === EventSource.CLOSED && state.events === es) {
      // Refused (the session ended, the inbox stopped): look again.
      setTimeout(async () => {
        if (state.events !== es) return;
        try {
          await api('api/session');
          listen();
        } catch (err) {
          if (err.status === 401) showLogin('Your session ended: log in again.');
          else setTimeout(listen, 3000);
        }
      }, 2000);
    }
  });
}

// refresh reads both lists again; calls made while one is under way are
// folded into one more.
function refresh() {
  if (state.refreshing) {
    state.again = true;
    return state.refreshing;
  }
  state.refreshing = (async () => {
    try {
      do {
        state.again = false;
        const [pending, history] = await Promise.all([api('api/pending'), api('api/history')]);
        state.offset = Date.parse(pending.now) - Date.now();
        renderPending(pending.calls, pending.more);
        renderHistory(history.calls, history.more);
      } while (state.again);
    } catch (err) {
      if (err.status === 401) showLogin('Your session ended: log in again.');
      else notice('Reading the calls failed: ' + err.message);
    } finally {
      state.refreshing = null;
    }
  })();
  return state.refreshing;
}

// --- pending ---------------------------------------------------------------

// renderPending adds the cards of new calls and removes those of calls no
// longer pending, leaving the others (and the reasons typed in them) alone;
// more calls than listed are counted.
function renderPending(calls, more) {
  const keys = new Set(calls.map((c) => c.key));
  for (const [key, card] of state.cards) {
    if (!keys.has(key)) {
      card.remove();
      state.cards.delete(key);
    }
  }
  let prev = null;
  for (const c of calls) {
    let card = state.cards.get(c.key);
    if (!card) {
      card = renderCall(c);
      state.cards.set(c.key, card);
    }
    if (prev ? prev.nextSibling !== card : $('pending').firstChild !== card) {
      if (prev) prev.after(card);
      else $('pending').prepend(card);
    }
    prev = card;
  }
  state.more = more;
  showCount();
  $('pending-more').hidden = more === 0;
  $('pending-more').textContent = `${more} more ${more === 1 ? 'call awaits' : 'calls await'} your approval, not listed here: ` +
    'they expire after these. Decide these, and the next come.';
  tick();
}

// showCount counts the cards shown and the calls not listed: at once when
// a card goes, not only when the lists are read again.
function showCount() {
  $('pending-count').textContent = String(state.cards.size + (state.more || 0));
  $('pending-empty').hidden = state.cards.size > 0;
}

function renderCall(c) {
  const reason = el('textarea', { class: 'reason', maxlength: 2000, rows: 2, placeholder: 'Why? Recorded with your decision.' });
  const approve = el('button', { class: 'approve', type: 'button', text: 'Approve', disabled: true });
  const deny = el('button', { class: 'deny', type: 'button', text: 'Deny', disabled: true });
  const error = el('p', { class: 'error', role: 'alert' });
  const left = el('span', { class: 'left', 'data-expires': Date.parse(c.expires_at) });
  const card = el('article', { class: 'call', 'data-key': c.key },
    el('header', {}, el('h2', { class: 'tool', text: c.tool }), left),
    meta([
      ['conversation', c.conversation_id, 'conversation'],
      ['turn', `${c.turn_index}` + (c.ordinal ? ` (call ${c.ordinal + 1} of the turn)` : ''), 'turn'],
      ['group', c.group, 'group'],
      ['requested', new Date(c.requested_at).toLocaleString(), 'requested'],
      ['expires', new Date(c.expires_at).toLocaleString(), 'expires'],
      ['tool_use_id', c.tool_use_id + (c.waiters > 1 ? ` and ${c.waiters - 1} more waiting` : ''), 'waiters'],
    ]),
    el('h3', { text: 'Arguments' }),
    fieldsTable(c.fields),
    ...(c.args_verified ? [] : [el('p', { class: 'error unverified', text: 'These args do not hash to the call\'s digest, so the inbox cannot show exactly what would run: it can be denied here, not approved.' })]),
    el('h3', { text: 'Exactly what runs (canonical JSON)' }),
    ...warnings(c),
    el('pre', { class: 'canonical', text: c.args_shown }),
    ...(c.unseen ? [el('details', { class: 'raw' },
      el('summary', { text: 'raw bytes, as digested (the characters that do not show are invisible here)' }),
      el('pre', { class: 'raw', text: c.args }))] : []),
    meta([['args digest (SHA-256)', c.args_digest, 'digest'], ['key', c.key, 'key']], 'ids'),
    el('details', {}, el('summary', { text: 'indented' }), el('pre', { class: 'pretty', text: c.args_pretty })),
    el('div', { class: 'decide' },
      el('label', { text: 'Reason (required)' }, reason),
      el('div', { class: 'buttons' }, approve, deny),
      error));
  const ready = () => {
    const expired = Number(left.dataset.expires) <= Date.now() + state.offset;
    deny.disabled = reason.value.trim() === '' || expired || card.dataset.busy === '1';
    approve.disabled = deny.disabled || !c.args_verified;
  };
  card.ready = ready;
  reason.addEventListener('input', ready);
  const decide = (decision) => async () => {
    card.dataset.busy = '1';
    ready();
    error.textContent = '';
    try {
      const got = await api('api/decide', {
        method: 'POST',
        body: { key: c.key, decision, reason: reason.value, digest: c.args_digest },
      });
      notice(`${c.tool} ${c.key.slice(0, 8)}… ${got.status} by ${state.me.name}.`);
      card.remove();
      state.cards.delete(c.key);
      showCount();
      refresh();
    } catch (err) {
      error.textContent = err.message;
      if (err.status === 401) showLogin('Your session ended: log in again.');
      if (err.status === 409 || err.status === 404) refresh();
    } finally {
      card.dataset.busy = '';
      ready();
    }
  };
  approve.addEventListener('click', decide('approve'));
  deny.addEventListener('click', decide('deny'));
  return card;
}

function meta(rows, cls = '') {
  const dl = el('dl', { class: 'meta ' + cls });
  for (const [label, value, name] of rows) dl.append(el('dt', { text: label }), el('dd', { class: name, text: value }));
  return dl;
}

// warnings say what in the args may not read as it is: characters that
// do not show (the server escapes them in every view but the raw bytes),
// and keys or strings that read as others.
function warnings(c) {
  const out = [];
  if (c.unseen) {
    out.push(el('p', { class: 'warn hidden-chars', role: 'alert',
      text: 'These args hold characters that do not show (zero-width, bidirectional, variation selectors, blank fillers and the like). ' +
        'They are written as \\u escapes in the values above (the rows marked) and in the JSON below: the same JSON value, ' +
        'not the same bytes. The digest is over the raw bytes.' }));
  }
  if (c.lookalikes.length > 0) {
    out.push(el('div', { class: 'warn lookalikes', role: 'alert' },
      el('p', { text: 'Some keys or strings read as others (words that mix scripts; keys that look alike, by a small table of Latin, Cyrillic, Greek and Armenian lookalikes):' }),
      el('ul', {}, ...c.lookalikes.map((l) => el('li', { text: l })))));
  }
  return out;
}

function fieldsTable(fields) {
  const t = el('table', { class: 'fields' });
  for (const f of fields) {
    const flags = [f.hidden ? 'hidden' : '', f.lookalike ? 'lookalike' : ''].filter(Boolean);
    const row = el('tr', { 'data-path': f.path, class: flags.join(' ') }, el('th', { text: f.path }), el('td', { class: f.kind, text: f.value }));
    if (flags.length > 0) row.title = (f.hidden ? 'holds characters that do not show, escaped. ' : '') + (f.lookalike ? 'reads as something else.' : '');
    t.append(row);
  }
  return t;
}

// tick counts down the time left of every pending call.
function tick() {
  const now = Date.now() + state.offset;
  for (const card of state.cards.values()) {
    const left = card.querySelector('.left');
    const ms = Number(left.dataset.expires) - now;
    left.textContent = ms > 0 ? timeLeft(ms) + ' left' : 'expired';
    left.classList.toggle('expired', ms <= 0);
    card.ready();
  }
}

function timeLeft(ms) {
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, '0');
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${two(m)}m`;
  if (m > 0) return `${m}m ${two(sec)}s`;
  return `${sec}s`;
}

// --- history ---------------------------------------------------------------

const stateText = { not_run_yet: 'not run yet' };

function renderHistory(calls, more) {
  const body = $('history').tBodies[0];
  body.replaceChildren(...calls.map((c) => el('tr', { 'data-key': c.key },
    el('td', { class: 'when', text: c.decided_at ? new Date(c.decided_at).toLocaleString() : '' }),
    el('td', { class: 'tool', text: c.tool }),
    el('td', { class: 'conversation', text: `${c.conversation_id} · ${c.turn_index}` }),
    el('td', { class: 'decision ' + c.decision, text: c.decision }),
    el('td', { class: 'by', text: c.by ?? '' }),
    el('td', { class: 'reason', text: c.reason ?? '' }),
    el('td', { class: 'state ' + c.state, text: stateText[c.state] ?? c.state }),
    el('td', {}, el('details', {}, el('summary', { text: c.args_digest.slice(0, 12) + '…' }),
      el('pre', { class: 'canonical', text: c.args_shown }))))));
  $('history-empty').hidden = calls.length > 0;
  $('history').hidden = calls.length === 0;
  $('history-more').hidden = more === 0;
  $('history-more').textContent = `and ${more} earlier ${more === 1 ? 'decision' : 'decisions'}, not listed here.`;
}

boot();
