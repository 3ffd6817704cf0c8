// The meshfed hub's dashboard: reads the admin API of the hub that served it (same origin)
// and draws it. Plain JavaScript, no build step, no dependency.
//
// Live updates are polling: every POLL_MS, while the tab is visible, the page asks for
// /api/overview (a few kilobytes the hub aggregates, whatever the number of sinks), the
// events after the last one it has (/api/events?since=), and the page of the list on
// screen. Polling needs no connection held per viewer in the hub, passes any proxy and
// `kubectl port-forward`, and stops costing anything when nobody looks.
//
// Everything is written with textContent, never parsed as HTML: names and messages come
// from clusters and sinks, not from the operator.
'use strict';

const POLL_MS = 2000;
const PAGE = 50; // rows of a list page
const KEEP_EVENTS = 500; // events kept in the page, newest
const ASK_MS = 10000; // a request unanswered this long has failed (the hub is unreachable)
const CONFIRM_MS = 10000; // how long an action waits for its confirming click

const state = {
  overview: null,
  who: null,
  events: [],
  nextEvent: 0,
  boot: '', // the hub process the numbers are of
  droppedEvents: false,
  kinds: null,
  timer: 0,
  // armed is the action waiting for its confirming click ({key, until}); it outlives the
  // redraws of the list it is in.
  armed: null,
};

// ---- small helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'on') for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const $ = (id) => document.getElementById(id);

// api GETs (or, with a method, sends) path and returns its JSON; a refusal throws an
// Error with the hub's message.
async function api(path, method, body) {
  const init = { method: method || 'GET', headers: { Accept: 'application/json' }, signal: AbortSignal.timeout(ASK_MS) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(path, init);
  const text = await res.text();
  if (!res.ok) throw new Error(`${method || 'GET'} ${path}: ${res.status} ${text.trim()}`);
  return JSON.parse(text);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v !== undefined && v !== null) q.set(k, v);
  return q.toString();
}

// short is a collection's last segment (virtualservices).
const short = (coll) => coll.slice(coll.lastIndexOf('/') + 1);

function fmtTime(t) {
  if (!t) return '';
  return new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

// age is how long before the hub's clock (the overview's time) t was.
function age(t) {
  if (!t) return 'never';
  const now = state.overview ? Date.parse(state.overview.time) : Date.now();
  let s = Math.max(0, Math.round((now - Date.parse(t)) / 1000));
  if (s < 90) return `${s}s ago`;
  s = Math.round(s / 60);
  if (s < 90) return `${s}m ago`;
  s = Math.round(s / 60);
  if (s < 48) return `${s}h ago`;
  return `${Math.round(s / 24)}d ago`;
}

function badge(text, kind) {
  return el('span', { class: `badge ${kind}` }, text);
}

function stateBadge(s) {
  return badge(s || 'unknown', { Synced: 'ok', Syncing: 'busy', Stale: 'warn', NACKed: 'bad' }[s] || 'muted');
}

function whyLink(collection, name) {
  return el('a', { href: '#why?' + query({ collection, name }) }, name);
}

// table fills t with a header row and rows; empty says what an empty list means.
function table(t, headers, rows, empty) {
  t.replaceChildren(el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))));
  const body = el('tbody');
  if (rows.length === 0) body.append(el('tr', {}, el('td', { colspan: headers.length, class: 'empty' }, empty)));
  for (const r of rows) body.append(r);
  t.append(body);
}

// pager draws "from–to of total" with previous and next, which set offset in the hash.
function pager(div, total, offset, limit) {
  div.replaceChildren();
  if (total <= limit && offset === 0) {
    div.append(`${total} in all`);
    return;
  }
  const to = Math.min(offset + limit, total);
  const move = (off) => () => setParams({ offset: off > 0 ? off : '' });
  div.append(
    el('button', { type: 'button', disabled: offset === 0, on: { click: move(offset - limit) } }, '‹ previous'),
    ` ${total === 0 ? 0 : offset + 1}–${to} of ${total} `,
    el('button', { type: 'button', disabled: to >= total, on: { click: move(offset + limit) } }, 'next ›'),
  );
}

// ---- the location: #view?param=value

function route() {
  const h = location.hash.replace(/^#/, '');
  const i = h.indexOf('?');
  const view = (i < 0 ? h : h.slice(0, i)) || 'clusters';
  return { view, params: new URLSearchParams(i < 0 ? '' : h.slice(i + 1)) };
}

function setParams(changes) {
  const { view, params } = route();
  for (const [k, v] of Object.entries(changes)) {
    if (v === '' || v === undefined) params.delete(k);
    else params.set(k, v);
  }
  const q = params.toString();
  location.hash = view + (q ? '?' + q : '');
}

// A filter form edits the hash (and so the view), resetting the page to the first.
function wireForms() {
  for (const form of document.querySelectorAll('form.filters')) {
    const apply = () => {
      const changes = { offset: '' };
      for (const f of form.elements) {
        if (!f.name) continue;
        changes[f.name] = f.type === 'checkbox' ? (f.checked ? '1' : '') : f.value.trim();
      }
      setParams(changes);
    };
    form.addEventListener('submit', (e) => { e.preventDefault(); apply(); });
    form.addEventListener('change', apply);
    // Search as one types, without a request per key.
    let t = 0;
    form.addEventListener('input', (e) => {
      if (e.target.type !== 'search') return;
      clearTimeout(t);
      t = setTimeout(apply, 300);
    });
  }
}

// syncForm shows the hash's parameters in the view's form (after a link or a reload).
function syncForm(view, params) {
  const form = document.querySelector(`form[data-view="${view}"]`);
  if (!form) return;
  for (const f of form.elements) {
    if (!f.name || f === document.activeElement) continue;
    if (f.type === 'checkbox') f.checked = params.get(f.name) === '1';
    else f.value = params.get(f.name) || '';
  }
}

// ---- the header: totals, who is looking, whether it is live

function renderHeader() {
  const o = state.overview;
  if (!o) return;
  const connected = o.clusters.filter((c) => c.connected).length;
  const synced = o.clusters.filter((c) => c.synced).length;
  const s = o.sinks;
  const item = (label, value, kind, href) => el('a', { class: `total ${kind || ''}`, href }, el('b', {}, value), label);
  $('totals').replaceChildren(
    o.ready ? '' : badge('warming up: sinks are not served yet', 'warn'),
    item(`clusters connected (${synced} synced)`, `${connected}/${o.clusters.length}`, connected < o.clusters.length ? 'warn' : 'ok', '#clusters'),
    item('sinks synced', `${s.synced}/${s.total}`, s.synced < s.total ? 'busy' : 'ok', '#fleets'),
    s.stale ? item('stale', s.stale, 'warn', '#sinks?state=Stale') : '',
    s.nacked ? item('NACKing', s.nacked, 'bad', '#sinks?state=NACKed') : '',
    item('refusals', o.refusals, o.refusals ? 'warn' : 'ok', '#refusals'),
    item('conflicts', o.conflicts, o.conflicts ? 'warn' : 'ok', '#conflicts'),
  );
}

function renderWho() {
  const w = state.who;
  if (!w) return;
  $('who').replaceChildren(
    el('span', { title: 'who the hub answers this page for' }, w.operator),
    ' · ',
    w.tenant ? `tenant ${w.tenant}` : 'every tenant',
    ' · ',
    w.canAct ? badge('may act', 'ok') : el('span', { class: 'badge muted', title: w.why || '' }, 'read-only'),
  );
}

function setLive(error) {
  const live = $('live');
  if (document.hidden) {
    live.textContent = 'paused while the tab is hidden';
    live.className = 'muted';
  } else if (error) {
    live.textContent = `not updating: ${error}`;
    live.className = 'bad';
  } else {
    live.textContent = `live · updated ${fmtTime(state.overview && state.overview.time)}`;
    live.className = 'ok';
  }
}

// ---- views

const views = {
  clusters: renderClusters,
  fleets: renderFleets,
  sinks: renderSinks,
  refusals: renderRefusals,
  conflicts: renderConflicts,
  why: renderWhy,
  events: renderEvents,
};

function problem(c) {
  return !c.connected || !c.synced || c.refusals > 0 || c.conflicts > 0 || c.breaker || c.refusedCollections > 0 || c.departed || c.unknown;
}

function renderClusters(params) {
  const o = state.overview;
  if (!o) return;
  const q = (params.get('q') || '').toLowerCase();
  const list = o.clusters.filter((c) => (!q || c.name.toLowerCase().includes(q) || c.tenant.toLowerCase().includes(q)) &&
    (params.get('problems') !== '1' || problem(c)));
  const offset = Number(params.get('offset')) || 0;
  // Only a hub with replicas says which replica holds each cluster.
  const replicas = o.clusters.some((c) => c.heldBy);
  const rows = list.slice(offset, offset + PAGE).map((c) => el('tr', { 'data-cluster': c.name },
    el('td', {}, c.name),
    el('td', {}, c.tenant),
    el('td', { 'data-col': 'connected' }, c.connected ? badge(`connected${c.streams > 1 ? ` (${c.streams} streams)` : ''}`, 'ok') :
      badge(c.departed ? 'removed from the configuration, kept until an operator confirms' :
        c.unknown ? `last state unknown: ${c.unknown}` :
          c.restored ? 'disconnected, restored from the state file' : 'disconnected', 'bad')),
    el('td', { 'data-col': 'synced' }, c.synced ? badge('synced', 'ok') : badge('not synced', 'warn')),
    el('td', { title: fmtTime(c.lastContact) }, c.connected ? 'now' : age(c.lastContact)),
    el('td', { 'data-col': 'objects', class: 'num' }, c.maxObjects ? `${c.objects} / ${c.maxObjects}` : String(c.objects)),
    el('td', { 'data-col': 'refusals', class: 'num' }, c.refusals ? el('a', { href: '#refusals?' + query({ cluster: c.name }) }, c.refusals) : '0',
      c.refusedCollections ? el('div', { class: 'muted' }, `${c.refusedCollections} collections not served by its source`) : ''),
    el('td', { 'data-col': 'conflicts', class: 'num' }, c.conflicts ? el('a', { href: '#conflicts?' + query({ q: c.name }) }, c.conflicts) : '0'),
    el('td', { 'data-col': 'breaker' }, breakerCell(c)),
    replicas ? el('td', {}, c.heldBy ? `${c.heldBy.replica} (epoch ${c.heldBy.epoch})` : 'none') : '',
  ));
  table($('clusters'), ['cluster', 'tenant', 'connection', 'synced', 'last contact', 'objects', 'refused', 'lost conflicts', 'breaker'].concat(replicas ? ['held by replica'] : []), rows,
    o.clusters.length ? 'no cluster matches' : 'no cluster is configured');
  pager($('clusters-pager'), list.length, offset, PAGE);
}

function breakerCell(c) {
  const b = c.breaker;
  if (!b) return '';
  const what = b.open ? badge(`open: holds ${b.held} deletions`, 'bad') : badge(`holding ${b.held} deletions`, 'warn');
  const out = [what, el('div', { class: 'muted' }, [b.reason, b.since ? `since ${fmtTime(b.since)}` : ''].filter(Boolean).join(', '))];
  // Actions are offered only to a viewer the hub would let act (whoami).
  if (state.who && state.who.canAct && (b.held > 0 || b.open)) out.push(releaseButton(c.name, b.held, b.digest));
  return out;
}

// releaseButton releases the deletions a cluster's breaker holds: they delete objects
// from every sink, so the first click only asks for a second one. It names the digest of
// the deletions shown, so the hub applies those or, if they changed meanwhile, nothing.
function releaseButton(cluster, held, digest) {
  const key = `release ${cluster}`;
  const armed = () => state.armed && state.armed.key === key && Date.now() < state.armed.until;
  const b = el('button', { type: 'button', class: 'action', 'data-action': 'release' },
    armed() ? `confirm: delete ${held} objects` : 'release held deletions…');
  b.addEventListener('click', async () => {
    if (!armed()) {
      state.armed = { key, until: Date.now() + CONFIRM_MS };
      b.textContent = `confirm: delete ${held} objects`;
      return;
    }
    state.armed = null;
    b.disabled = true;
    try {
      const r = await api(`/api/clusters/${encodeURIComponent(cluster)}/breaker/release`, 'POST', { digest });
      const n = Object.values(r.deleted || {}).reduce((a, b) => a + b, 0);
      showNotice(`Released ${n} held deletions of cluster ${r.cluster} (by ${r.operator}).`);
    } catch (e) {
      showError(e.message);
    }
    poll();
  });
  return b;
}

function bar(f) {
  const wrap = el('div', { class: 'bar', title: `${f.synced} synced, ${f.syncing} syncing, ${f.stale} stale, ${f.nacked} NACKed` });
  for (const [n, kind] of [[f.synced, 'ok'], [f.syncing, 'busy'], [f.stale, 'warn'], [f.nacked, 'bad']]) {
    if (!n) continue;
    const seg = el('span', { class: kind });
    seg.style.width = `${(100 * n) / f.total}%`; // CSSOM, which the CSP allows
    wrap.append(seg);
  }
  return wrap;
}

function renderFleets() {
  const o = state.overview;
  if (!o) return;
  const link = (f, state, n) => (n ? el('a', { href: '#sinks?' + query({ fleet: f.key, state }) }, n) : '0');
  const rows = o.fleets.map((f) => el('tr', { 'data-fleet': f.key },
    el('td', {}, f.tenant || el('span', { class: 'muted' }, 'no tenant')),
    el('td', {}, el('a', { href: '#sinks?' + query({ fleet: f.key }) }, f.rules.length ? f.rules.join(', ') : 'no rule: receives nothing')),
    el('td', { class: 'num' }, f.total),
    el('td', {}, bar(f)),
    el('td', { class: 'num' }, link(f, 'Synced', f.synced)),
    el('td', { class: 'num' }, link(f, 'Syncing', f.syncing)),
    el('td', { class: 'num', 'data-col': 'stale' }, link(f, 'Stale', f.stale)),
    el('td', { class: 'num', 'data-col': 'nacked' }, link(f, 'NACKed', f.nacked)),
    el('td', {}, f.oldestBehind ? `since ${age(f.oldestBehind)}` : ''),
  ));
  table($('fleets'), ['tenant', 'rules', 'sinks', '', 'synced', 'syncing', 'stale', 'NACKing', 'oldest unanswered push'], rows, 'no sink is connected');
}

// fleetOptions keeps the sink view's fleet list in step with the overview.
function fleetOptions(selected) {
  const sel = document.querySelector('form[data-view="sinks"] select[name="fleet"]');
  const want = [''].concat((state.overview ? state.overview.fleets : []).map((f) => f.key));
  if (selected && !want.includes(selected)) want.push(selected);
  const have = Array.from(sel.options).map((o) => o.value);
  if (have.join('\n') === want.join('\n')) return;
  sel.replaceChildren(...want.map((k) => el('option', { value: k }, k || 'every fleet')));
  sel.value = selected || '';
}

async function renderSinks(params) {
  fleetOptions(params.get('fleet'));
  const offset = Number(params.get('offset')) || 0;
  const p = await api('/api/sinks?' + query({ fleet: params.get('fleet'), state: params.get('state'), q: params.get('q'), offset, limit: PAGE }));
  const rows = p.sinks.map((s) => {
    const colls = Object.entries(s.collections || {}).sort(([a], [b]) => a.localeCompare(b));
    const nack = colls.map(([, c]) => c).find((c) => c.state === 'NACKed');
    return el('tr', { 'data-stream': s.stream },
      el('td', { class: 'num' }, s.stream),
      el('td', {}, s.identity || el('span', { class: 'muted' }, 'none'), s.unauthenticated ? el('div', { class: 'muted' }, 'unauthenticated') : ''),
      el('td', {}, s.nodeId),
      el('td', {}, s.tenant || ''),
      el('td', {}, (s.rules || []).join(', ')),
      el('td', { 'data-col': 'state' }, stateBadge(s.state), nack ? el('div', { class: 'bad' }, nack.lastNack) : ''),
      el('td', {}, s.behindSince ? age(s.behindSince) : ''),
      el('td', { class: 'colls' }, colls.map(([name, c]) => el('div', { title: `pushed ${c.pushedVersion}, ACKed ${c.ackedVersion}` }, stateBadge(c.state), ` ${short(name)} (${c.resources})`))),
      el('td', {}, `${s.protocol}, ${s.transport === 'client' ? 'dialed by the hub' : 'dialed in'}`, el('div', { class: 'muted' }, s.peer)),
    );
  });
  table($('sinks'), ['stream', 'identity', 'node id', 'tenant', 'rules', 'state', 'unanswered since', 'collections', 'connection'], rows, 'no sink matches');
  pager($('sinks-pager'), p.total, offset, PAGE);
}

async function renderRefusals(params) {
  const host = params.get('host') || '';
  const namespace = params.get('namespace') || '';
  const offset = Number(params.get('offset')) || 0;
  const [owners, p] = await Promise.all([
    host || namespace ? api('/api/owners?' + query(host ? { host } : { namespace })) : null,
    api('/api/refusals?' + query({ host, namespace, cluster: params.get('cluster'), q: params.get('q'), offset, limit: PAGE })),
  ]);
  const o = $('owners');
  o.replaceChildren();
  if (owners) {
    const what = host ? `host ${host}` : `namespace ${namespace}`;
    let answer;
    if (owners.notYours) answer = 'is not owned by any of your clusters';
    else if (owners.clusters.length === 0) answer = 'is owned by no cluster';
    else answer = `is owned by ${owners.clusters.join(', ')}${owners.tenant ? ` (tenant ${owners.tenant})` : ''}`;
    o.append(el('p', { class: 'answer', 'data-owners': owners.clusters.join(',') }, `${what} ${answer}.`));
  }
  if (params.get('cluster')) o.append(el('p', {}, `Refusals of cluster ${params.get('cluster')} `, el('a', { href: '#refusals' }, '(every cluster)')));
  const rows = p.refusals.map((r) => el('tr', { 'data-refusal': `${r.cluster} ${r.name}` },
    el('td', {}, r.cluster),
    el('td', {}, r.tenant),
    el('td', {}, short(r.collection)),
    el('td', {}, whyLink(r.collection, r.name)),
    el('td', { 'data-col': 'reason' }, r.reason),
  ));
  table($('refusals'), ['cluster', 'tenant', 'collection', 'object', 'why it is not served'], rows, 'no refused object matches');
  pager($('refusals-pager'), p.total, offset, PAGE);
  // Who tried: the recent events naming the host or namespace.
  const term = host || namespace;
  const ev = $('ledger-events');
  ev.replaceChildren();
  if (term) {
    const named = state.events.filter((e) => (e.message || '').includes(term) || (e.name || '').startsWith(namespace + '/'));
    ev.append(el('h2', {}, `Recent events naming ${term}`), eventTable(named.slice(-PAGE).reverse()));
  }
}

async function renderConflicts(params) {
  const list = await api('/api/conflicts');
  const q = (params.get('q') || '').toLowerCase();
  const sel = list.filter((c) => !q || [c.collection, c.name, c.winner, ...c.losers].some((s) => s.toLowerCase().includes(q)));
  const offset = Number(params.get('offset')) || 0;
  const rows = sel.slice(offset, offset + PAGE).map((c) => el('tr', { 'data-conflict': c.name },
    el('td', {}, short(c.collection)),
    el('td', {}, whyLink(c.collection, c.name)),
    el('td', {}, badge(c.winner, 'ok')),
    el('td', {}, c.losers.join(', ')),
    el('td', {}, c.why),
  ));
  table($('conflicts'), ['collection', 'object', 'served from', 'held from', 'because'], rows, list.length ? 'no conflict matches' : 'no two clusters publish the same object');
  pager($('conflicts-pager'), sel.length, offset, PAGE);
}

async function renderWhy(params) {
  const sel = document.querySelector('form[data-view="why"] select[name="collection"]');
  if (!state.kinds) {
    state.kinds = await api('/api/kinds');
    sel.replaceChildren(...state.kinds.map((k) => el('option', { value: k.collection }, `${k.kind} (${k.collection})`)));
  }
  const collection = params.get('collection');
  const name = params.get('name');
  if (collection) sel.value = collection;
  const out = $('why');
  if (!collection || !name) {
    out.replaceChildren(el('p', { class: 'hint' }, 'Name an object (namespace/name) to see who publishes it, which copy is served and why, who was refused, and which sinks have it.'));
    return;
  }
  const w = await api('/api/why?' + query({ collection, name }));
  const story = [];
  story.push(el('h2', {}, `${short(w.collection)} ${w.name}`));
  if (w.served) story.push(el('p', { class: 'answer', 'data-served': w.served.cluster }, 'Served from cluster ', el('b', {}, w.served.cluster), `, version ${w.served.version}`, w.conflict ? ` (several publish it; the rule that picked it: ${w.conflict})` : '', '.'));
  else story.push(el('p', { class: 'answer bad', 'data-served': '' }, 'Not served.'));
  const cands = el('table');
  table(cands, ['cluster', 'version', 'created', 'served', ''], w.candidates.map((c) => el('tr', {},
    el('td', {}, c.cluster), el('td', {}, c.version), el('td', {}, fmtTime(c.created)),
    el('td', {}, c.served ? badge('served', 'ok') : badge('held', 'muted')), el('td', {}, c.heldBecause || ''))), 'no cluster publishes it');
  story.push(el('h3', {}, 'Published by'), cands);
  const rej = el('table');
  table(rej, ['cluster', 'why it is refused'], w.rejected.map((r) => el('tr', { 'data-refusal': r.cluster }, el('td', {}, r.cluster), el('td', { 'data-col': 'reason' }, r.reason))), 'no cluster was refused it');
  story.push(el('h3', {}, 'Refused from'), rej);
  const sinks = el('table');
  table(sinks, ['sink', 'rules', 'has the served version'], w.sinks.map((s) => el('tr', {},
    el('td', {}, s.behindRelay ? `${s.nodeId} (behind relay stream ${s.behindRelay})` : `${s.identity || s.nodeId} (stream ${s.stream}, ${s.protocol})`),
    el('td', {}, (s.rules || []).join(', ')),
    el('td', {}, s.nack ? badge(`NACKed: ${s.nack}`, 'bad') : s.upToDate ? badge('up to date', 'ok') : badge('not yet', 'busy')))), 'no connected sink receives it');
  story.push(el('h3', {}, 'Sinks'), sinks);
  out.replaceChildren(...story);
}

function eventTable(list) {
  const t = el('table', { class: 'events' });
  table(t, ['time', 'kind', 'reason', 'tenant', 'cluster', 'object', 'what happened'], list.map((e) => el('tr', { 'data-kind': e.kind, 'data-seq': e.seq },
    el('td', {}, fmtTime(e.time)),
    el('td', {}, e.kind),
    el('td', {}, badge(e.reason, { refusal: 'warn', breaker: 'bad' }[e.kind] || 'muted')),
    el('td', {}, e.tenant || ''),
    el('td', {}, e.cluster || ''),
    el('td', {}, e.collection && e.name ? whyLink(e.collection, e.name) : e.name || ''),
    el('td', {}, e.message),
  )), 'no event');
  return t;
}

function renderEvents(params) {
  const kind = params.get('kind') || '';
  const q = (params.get('q') || '').toLowerCase();
  const list = state.events.filter((e) => (!kind || e.kind === kind) &&
    (!q || [e.cluster, e.name, e.message, e.tenant].some((s) => (s || '').toLowerCase().includes(q))));
  const t = eventTable(list.slice().reverse());
  $('events').replaceChildren(...t.childNodes);
  if (state.droppedEvents) $('events').append(el('caption', {}, 'The hub no longer keeps some events older than these.'));
}

// ---- polling

async function pollEvents() {
  const e = await api('/api/events?since=' + state.nextEvent + '&boot=' + encodeURIComponent(state.boot));
  if (e.reset) {
    // Another hub process answered (a restart, or another replica): its numbers are its own.
    state.events = [];
    state.droppedEvents = false;
  }
  if (e.dropped) state.droppedEvents = true;
  state.events = state.events.concat(e.events || []).slice(-KEEP_EVENTS);
  state.nextEvent = e.next;
  state.boot = e.boot;
}

function showError(msg) {
  $('error').textContent = msg;
}

function showNotice(msg) {
  $('notice').textContent = msg;
}

let rendering = Promise.resolve();

// render draws the view the location names; views that read the API wait for it.
function render() {
  const { view, params } = route();
  const name = views[view] ? view : 'clusters';
  for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== `view-${name}`;
  for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('current', a.getAttribute('href') === `#${name}`);
  syncForm(name, params);
  rendering = rendering.then(async () => {
    try {
      await views[name](params);
      showError('');
    } catch (e) {
      showError(e.message);
    }
  });
  return rendering;
}

// poll refreshes what the page shows, then schedules the next refresh.
async function poll() {
  clearTimeout(state.timer);
  if (!document.hidden) {
    try {
      const [o, w] = await Promise.all([api('/api/overview'), state.who ? state.who : api('/api/whoami'), pollEvents()]);
      state.overview = o;
      state.who = w;
      renderWho();
      renderHeader();
      await render();
      setLive('');
    } catch (e) {
      setLive(e.message);
    }
  } else {
    setLive('');
  }
  state.timer = setTimeout(poll, POLL_MS);
}

document.addEventListener('DOMContentLoaded', () => {
  wireForms();
  window.addEventListener('hashchange', render);
  document.addEventListener('visibilitychange', poll);
  poll();
});
