// packrat's web console: a small S3 client in the browser. It signs in by exchanging an access
// key and secret for a session cookie (POST /console/session), then calls packrat's own S3 API
// and admin API with that cookie and the x-packrat-console header (no request signing in the
// browser, and the secret is not kept by the page). Every value from the server goes into the
// page as text, never as HTML.
'use strict';

const CONSOLE = { 'x-packrat-console': '1' };
const MULTIPART_FROM = 16 * 1024 * 1024;
const PART_BYTES = 8 * 1024 * 1024;
let me = null;
let metricsTimer = null;

// ---- small helpers

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else if (v !== false && v != null) e.setAttribute(k, v);
  }
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function show(...nodes) {
  const main = document.getElementById('main');
  main.replaceChildren(...nodes);
}

function flash(msg, ok) {
  const f = document.getElementById('flash');
  f.textContent = msg;
  f.className = ok ? 'ok' : '';
  f.hidden = !msg;
}

function bytes(n) {
  n = Number(n);
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}

const enc = (key) => key.split('/').map(encodeURIComponent).join('/');
const xml = (text) => new DOMParser().parseFromString(text, 'application/xml');
const kids = (node, tag) => Array.from(node.getElementsByTagName(tag));
const text = (node, tag) => { const n = node.getElementsByTagName(tag)[0]; return n ? n.textContent : ''; };

function errorOf(status, body) {
  if (body && body.trim().startsWith('<')) {
    const d = xml(body);
    const code = text(d, 'Code');
    if (code) return new Error(code + ': ' + text(d, 'Message'));
  }
  try { const j = JSON.parse(body); if (j.error) return new Error(j.error); } catch (_) { /* not JSON */ }
  return new Error('HTTP ' + status + (body ? ': ' + body.slice(0, 200) : ''));
}

async function call(method, path, opts = {}) {
  const r = await fetch(path, {
    method,
    headers: { ...CONSOLE, ...(opts.headers || {}) },
    body: opts.body,
    credentials: 'same-origin',
  });
  if (r.status === 401 || (r.status === 403 && !opts.keep403)) {
    const body = await r.text();
    if (body.includes('console session')) { signedOut(); }
    throw errorOf(r.status, body);
  }
  if (!r.ok) throw errorOf(r.status, await r.text());
  return r;
}

const s3xml = async (method, path, opts) => xml(await (await call(method, path, opts)).text());
const admin = async (method, path, body) =>
  (await call(method, '/_packrat/admin/' + path, body ? { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } } : {})).json();

// ---- session

async function signIn(ev) {
  ev.preventDefault();
  const ak = document.getElementById('ak').value.trim();
  const sk = document.getElementById('sk').value;
  try {
    const r = await fetch('/console/session', {
      method: 'POST', headers: { ...CONSOLE, 'content-type': 'application/json' },
      body: JSON.stringify({ access_key: ak, secret_key: sk }), credentials: 'same-origin',
    });
    if (!r.ok) throw errorOf(r.status, await r.text());
    me = await r.json();
    flash('');
    signedIn();
  } catch (e) {
    flash('Sign-in failed: ' + e.message);
  }
}

function signedIn() {
  document.getElementById('nav').hidden = false;
  document.getElementById('nav-keys').hidden = !me.is_root;
  document.getElementById('nav-storage').hidden = !me.is_root;
  document.getElementById('who').textContent = me.name + ' (' + me.access_key + ')';
  document.getElementById('signout').hidden = false;
  if (!location.hash || location.hash === '#/signin') location.hash = '#/buckets';
  else route();
}

function signedOut() {
  me = null;
  document.getElementById('nav').hidden = true;
  document.getElementById('who').textContent = '';
  document.getElementById('signout').hidden = true;
  signInPage();
}

async function signOut() {
  await fetch('/console/session', { method: 'DELETE', headers: CONSOLE, credentials: 'same-origin' });
  location.hash = '#/signin';
  signedOut();
}

function signInPage() {
  stopMetrics();
  show(el('form', { class: 'card signin', id: 'signin', onsubmit: signIn },
    el('h1', {}, 'Sign in'),
    el('p', { class: 'muted' }, 'With an access key and its secret. The secret is sent once, over this connection, and exchanged for a session.'),
    el('label', { for: 'ak' }, 'Access key'), el('input', { type: 'text', id: 'ak', autocomplete: 'username', required: true }),
    el('label', { for: 'sk' }, 'Secret key'), el('input', { type: 'password', id: 'sk', autocomplete: 'current-password', required: true }),
    el('div', { class: 'row' }, el('button', { class: 'primary', type: 'submit', id: 'signin-go' }, 'Sign in'))));
}

// ---- buckets

async function bucketsPage() {
  const d = await s3xml('GET', '/');
  const rows = kids(d, 'Bucket').map((b) => {
    const name = text(b, 'Name');
    return el('tr', { 'data-bucket': name },
      el('td', {}, el('a', { href: '#/b/' + encodeURIComponent(name) + '/' }, name)),
      el('td', {}, text(b, 'CreationDate')),
      el('td', {},
        el('a', { href: '#/s/' + encodeURIComponent(name) }, 'Settings'), ' ',
        el('button', { class: 'danger', onclick: () => deleteBucket(name) }, 'Delete')));
  });
  const input = el('input', { type: 'text', id: 'new-bucket', placeholder: 'new bucket name' });
  show(el('h1', {}, 'Buckets'),
    el('div', { class: 'row' }, input,
      el('button', { class: 'primary', id: 'create-bucket', onclick: () => createBucket(input.value.trim()) }, 'Create bucket')),
    el('table', { id: 'buckets' }, el('tr', {}, el('th', {}, 'Name'), el('th', {}, 'Created'), el('th', {}, '')), rows),
    rows.length ? '' : el('p', { class: 'muted' }, 'No buckets yet.'));
}

async function createBucket(name) {
  try {
    await call('PUT', '/' + encodeURIComponent(name));
    flash('Created bucket ' + name, true);
    bucketsPage();
  } catch (e) { flash(e.message); }
}

async function deleteBucket(name) {
  if (!confirm('Delete bucket ' + name + '? It must be empty.')) return;
  try {
    await call('DELETE', '/' + encodeURIComponent(name));
    flash('Deleted bucket ' + name, true);
    bucketsPage();
  } catch (e) { flash(e.message); }
}

async function settingsPage(bucket) {
  const b = '/' + encodeURIComponent(bucket);
  const acl = await s3xml('GET', b + '?acl');
  const isPublic = kids(acl, 'URI').some((u) => u.textContent.endsWith('/AllUsers'));
  let lifecycle = '';
  const r = await fetch(b + '?lifecycle', { headers: CONSOLE, credentials: 'same-origin' });
  if (r.ok) lifecycle = await r.text();
  let policy = '';
  const rp = await fetch(b + '?policy', { headers: CONSOLE, credentials: 'same-origin' });
  if (rp.ok) policy = await rp.text();
  const versioning = text(await s3xml('GET', b + '?versioning'), 'Status') || 'Never enabled';
  const vstate = el('span', { id: 'versioning-state' }, versioning);
  const setVersioning = (status) => async () => {
    try {
      await call('PUT', b + '?versioning', {
        body: '<VersioningConfiguration><Status>' + status + '</Status></VersioningConfiguration>',
        headers: { 'content-type': 'application/xml' },
      });
      vstate.textContent = status;
      flash('Versioning ' + status.toLowerCase(), true);
    } catch (e) { flash(e.message); }
  };
  const pub = el('input', { type: 'checkbox', id: 'public-read', checked: isPublic });
  const lc = el('textarea', { id: 'lifecycle', placeholder: '<LifecycleConfiguration>...</LifecycleConfiguration>' });
  lc.value = lifecycle;
  const pol = el('textarea', { id: 'policy', placeholder: '{"Version": "2012-10-17", "Statement": [...]}' });
  pol.value = policy;
  show(el('h1', {}, 'Bucket ', bucket),
    el('div', { class: 'card' }, el('h2', {}, 'Access'),
      el('label', {}, pub, ' Anyone may read objects (public-read)'),
      el('div', { class: 'row' }, el('button', {
        class: 'primary', id: 'save-acl', onclick: async () => {
          try {
            await call('PUT', b + '?acl', { headers: { 'x-amz-acl': pub.checked ? 'public-read' : 'private' } });
            flash('Saved: ' + (pub.checked ? 'public-read' : 'private'), true);
          } catch (e) { flash(e.message); }
        },
      }, 'Save access'))),
    el('div', { class: 'card' }, el('h2', {}, 'Versioning'),
      el('p', {}, 'State: ', vstate, '. With versioning an overwrite keeps the version before it and a delete leaves a delete marker; it can be suspended, never turned off.'),
      el('div', { class: 'row' },
        el('button', { class: 'primary', id: 'versioning-enable', onclick: setVersioning('Enabled') }, 'Enable'),
        el('button', { id: 'versioning-suspend', onclick: setVersioning('Suspended') }, 'Suspend'))),
    el('div', { class: 'card' }, el('h2', {}, 'Lifecycle rules (S3 XML)'), lc,
      el('div', { class: 'row' },
        el('button', {
          class: 'primary', id: 'save-lifecycle', onclick: async () => {
            try { await call('PUT', b + '?lifecycle', { body: lc.value, headers: { 'content-type': 'application/xml' } }); flash('Lifecycle saved', true); } catch (e) { flash(e.message); }
          },
        }, 'Save rules'),
        el('button', {
          class: 'danger', onclick: async () => {
            try { await call('DELETE', b + '?lifecycle'); lc.value = ''; flash('Lifecycle removed', true); } catch (e) { flash(e.message); }
          },
        }, 'Remove rules'))),
    el('div', { class: 'card' }, el('h2', {}, 'Bucket policy (S3 JSON)'), pol,
      el('div', { class: 'row' },
        el('button', {
          class: 'primary', id: 'save-policy', onclick: async () => {
            try { await call('PUT', b + '?policy', { body: pol.value, headers: { 'content-type': 'application/json' } }); flash('Policy saved', true); } catch (e) { flash(e.message); }
          },
        }, 'Save policy'),
        el('button', {
          class: 'danger', id: 'remove-policy', onclick: async () => {
            try { await call('DELETE', b + '?policy'); pol.value = ''; flash('Policy removed', true); } catch (e) { flash(e.message); }
          },
        }, 'Remove policy'))));
}

// ---- objects

async function objectsPage(bucket, prefix, token) {
  const q = new URLSearchParams({ 'list-type': '2', delimiter: '/', prefix, 'max-keys': '200' });
  if (token) q.set('continuation-token', token);
  const d = await s3xml('GET', '/' + encodeURIComponent(bucket) + '?' + q);
  const crumbs = [el('a', { href: '#/buckets' }, 'Buckets'), ' / ', el('a', { href: '#/b/' + encodeURIComponent(bucket) + '/' }, bucket)];
  let acc = '';
  for (const part of prefix.split('/').filter(Boolean)) {
    acc += part + '/';
    crumbs.push(' / ', el('a', { href: '#/b/' + encodeURIComponent(bucket) + '/' + enc(acc) }, part));
  }
  const rows = [];
  for (const p of kids(d, 'CommonPrefixes')) {
    const pre = text(p, 'Prefix');
    rows.push(el('tr', { class: 'folder' }, el('td', {}, el('a', { href: '#/b/' + encodeURIComponent(bucket) + '/' + enc(pre) }, pre.slice(prefix.length))), el('td', {}, ''), el('td', {}, ''), el('td', {}, '')));
  }
  for (const o of kids(d, 'Contents')) {
    const key = text(o, 'Key');
    rows.push(el('tr', { 'data-key': key },
      el('td', {}, el('a', { href: '#/o/' + encodeURIComponent(bucket) + '/' + enc(key) }, key.slice(prefix.length))),
      el('td', { class: 'num' }, bytes(text(o, 'Size'))),
      el('td', {}, text(o, 'LastModified')),
      el('td', {},
        el('button', { onclick: () => download(bucket, key) }, 'Download'), ' ',
        el('button', { class: 'danger', onclick: () => deleteObject(bucket, key, prefix) }, 'Delete'))));
  }
  const next = text(d, 'NextContinuationToken');
  const file = el('input', { type: 'file', id: 'upload-file', multiple: true });
  const bar = el('div', {});
  const status = el('span', { id: 'upload-status', class: 'muted' });
  show(el('h1', { class: 'crumbs' }, crumbs),
    el('div', { class: 'row' }, el('a', { id: 'show-versions', href: '#/v/' + encodeURIComponent(bucket) + '/' + enc(prefix) }, 'Show versions (deleted objects and older versions)')),
    el('div', { class: 'card row' }, 'Upload to ' + (prefix || '/') + ':', file,
      el('button', { class: 'primary', id: 'upload-go', onclick: () => upload(bucket, prefix, file.files, bar, status) }, 'Upload'),
      el('span', { class: 'progress' }, bar), status),
    el('table', { id: 'objects' }, el('tr', {}, el('th', {}, 'Name'), el('th', {}, 'Size'), el('th', {}, 'Last modified'), el('th', {}, '')), rows),
    rows.length ? '' : el('p', { class: 'muted' }, 'Nothing here yet.'),
    next ? el('div', { class: 'row' }, el('button', { id: 'more', onclick: () => objectsPage(bucket, prefix, next) }, 'Next page')) : '');
}

// The versions and delete markers of a ListObjectVersions answer, in the answer's order (by
// key, newest first within a key).
const versionEntries = (d) => kids(d.documentElement, '*').filter((n) => n.tagName === 'Version' || n.tagName === 'DeleteMarker');

// One row of a version listing: a version (download, delete for good) or a delete marker
// (delete it, and the version before it is current again).
function versionRow(bucket, v, marker, prefix, redraw) {
  const key = text(v, 'Key');
  const id = text(v, 'VersionId');
  const latest = text(v, 'IsLatest') === 'true';
  const path = '/' + encodeURIComponent(bucket) + '/' + enc(key) + '?versionId=' + encodeURIComponent(id);
  const remove = async () => {
    const what = marker ? 'the delete marker of ' + key : 'version ' + id + ' of ' + key + ' for good';
    if (!confirm('Delete ' + what + '?')) return;
    try {
      await call('DELETE', path);
      flash('Deleted ' + what, true);
      redraw();
    } catch (e) { flash(e.message); }
  };
  return el('tr', { 'data-key': key, 'data-version': id, class: marker ? 'marker' : '' },
    el('td', {}, key.slice(prefix.length)),
    el('td', { class: 'mono' }, id),
    el('td', {}, latest ? 'current' : ''),
    el('td', { class: 'num' }, marker ? 'delete marker' : bytes(text(v, 'Size'))),
    el('td', {}, text(v, 'LastModified')),
    el('td', {},
      marker ? '' : el('button', { onclick: () => download(bucket, key, id) }, 'Download'), ' ',
      el('button', { class: 'danger', onclick: remove }, marker ? 'Remove marker' : 'Delete version')));
}

// Versions and delete markers under a prefix (ListObjectVersions, 200 a page).
async function versionsPage(bucket, prefix, keyMarker, versionMarker) {
  const q = new URLSearchParams({ versions: '', delimiter: '/', prefix, 'max-keys': '200' });
  if (keyMarker) q.set('key-marker', keyMarker);
  if (versionMarker) q.set('version-id-marker', versionMarker);
  const d = await s3xml('GET', '/' + encodeURIComponent(bucket) + '?' + q);
  const redraw = () => versionsPage(bucket, prefix, keyMarker, versionMarker);
  const rows = [];
  for (const p of kids(d, 'CommonPrefixes')) {
    const pre = text(p, 'Prefix');
    rows.push(el('tr', { class: 'folder' }, el('td', {}, el('a', { href: '#/v/' + encodeURIComponent(bucket) + '/' + enc(pre) }, pre.slice(prefix.length))), el('td', {}, ''), el('td', {}, ''), el('td', {}, ''), el('td', {}, ''), el('td', {}, '')));
  }
  for (const v of versionEntries(d)) rows.push(versionRow(bucket, v, v.tagName === 'DeleteMarker', prefix, redraw));
  const nextKey = text(d, 'NextKeyMarker');
  const nextVersion = text(d, 'NextVersionIdMarker');
  show(el('h1', { class: 'crumbs' }, el('a', { href: '#/buckets' }, 'Buckets'), ' / ',
    el('a', { href: '#/b/' + encodeURIComponent(bucket) + '/' + enc(prefix) }, bucket + '/' + prefix), ' (versions)'),
    el('table', { id: 'versions' }, el('tr', {}, el('th', {}, 'Name'), el('th', {}, 'Version'), el('th', {}, ''), el('th', {}, 'Size'), el('th', {}, 'Last modified'), el('th', {}, '')), rows),
    rows.length ? '' : el('p', { class: 'muted' }, 'No versions here.'),
    text(d, 'IsTruncated') === 'true' ? el('div', { class: 'row' }, el('button', { id: 'more-versions', onclick: () => versionsPage(bucket, prefix, nextKey, nextVersion) }, 'Next page')) : '');
}

function putWithProgress(url, body, headers, onProgress) {
  return new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open('PUT', url);
    for (const [k, v] of Object.entries({ ...CONSOLE, ...headers })) x.setRequestHeader(k, v);
    x.upload.onprogress = (e) => onProgress(e.loaded);
    x.onload = () => (x.status < 300 ? resolve(x) : reject(errorOf(x.status, x.responseText)));
    x.onerror = () => reject(new Error('the connection failed'));
    x.send(body);
  });
}

async function upload(bucket, prefix, files, bar, status) {
  const total = Array.from(files).reduce((n, f) => n + f.size, 0);
  let done = 0;
  const paint = (inFlight) => {
    const pct = total ? Math.round(100 * (done + inFlight) / total) : 100;
    bar.style.width = pct + '%';
    status.textContent = bytes(done + inFlight) + ' of ' + bytes(total) + ' (' + pct + '%)';
  };
  try {
    for (const f of files) {
      const path = '/' + encodeURIComponent(bucket) + '/' + enc(prefix + f.name);
      const type = f.type ? { 'content-type': f.type } : {};
      if (f.size < MULTIPART_FROM) {
        await putWithProgress(path, f, type, paint);
      } else {
        // Multipart: 8 MiB parts, one after the other, each with its progress.
        const init = await s3xml('POST', path + '?uploads', { headers: type });
        const id = text(init, 'UploadId');
        const etags = [];
        try {
          for (let off = 0, n = 1; off < f.size; off += PART_BYTES, n++) {
            const part = f.slice(off, off + PART_BYTES);
            const x = await putWithProgress(path + '?partNumber=' + n + '&uploadId=' + encodeURIComponent(id), part, {}, (l) => paint(off + l));
            etags.push(x.getResponseHeader('ETag'));
          }
          const body = '<CompleteMultipartUpload>' + etags.map((e, i) => '<Part><PartNumber>' + (i + 1) + '</PartNumber><ETag>' + e + '</ETag></Part>').join('') + '</CompleteMultipartUpload>';
          await call('POST', path + '?uploadId=' + encodeURIComponent(id), { body, headers: { 'content-type': 'application/xml' } });
        } catch (e) {
          await call('DELETE', path + '?uploadId=' + encodeURIComponent(id)).catch(() => {});
          throw e;
        }
      }
      done += f.size;
      paint(0);
    }
    status.textContent = 'Uploaded ' + files.length + ' file(s), ' + bytes(total);
    flash('Uploaded ' + files.length + ' file(s)', true);
    setTimeout(() => objectsPage(bucket, prefix), 300);
  } catch (e) {
    status.textContent = 'Upload failed';
    flash('Upload failed: ' + e.message);
  }
}

async function download(bucket, key, versionId) {
  try {
    const version = versionId ? '?versionId=' + encodeURIComponent(versionId) : '';
    const r = await call('GET', '/' + encodeURIComponent(bucket) + '/' + enc(key) + version);
    const url = URL.createObjectURL(await r.blob());
    const a = el('a', { href: url, download: key.split('/').pop() });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) { flash(e.message); }
}

async function deleteObject(bucket, key, prefix) {
  if (!confirm('Delete ' + key + '?')) return;
  try {
    await call('DELETE', '/' + encodeURIComponent(bucket) + '/' + enc(key));
    flash('Deleted ' + key, true);
    objectsPage(bucket, prefix);
  } catch (e) { flash(e.message); }
}

async function objectPage(bucket, key) {
  const path = '/' + encodeURIComponent(bucket) + '/' + enc(key);
  const head = await call('HEAD', path);
  const rows = [];
  for (const [k, v] of head.headers) {
    if (['content-length', 'content-type', 'etag', 'last-modified', 'x-amz-storage-class'].includes(k) || k.startsWith('x-amz-meta-')) {
      rows.push(el('tr', {}, el('th', {}, k), el('td', {}, v)));
    }
  }
  const tags = await s3xml('GET', path + '?tagging');
  const tagText = kids(tags, 'Tag').map((t) => text(t, 'Key') + '=' + text(t, 'Value')).join('\n');
  const ta = el('textarea', { id: 'tags', placeholder: 'key=value, one per line' });
  ta.value = tagText;
  const dir = key.includes('/') ? key.slice(0, key.lastIndexOf('/') + 1) : '';
  const listed = await s3xml('GET', '/' + encodeURIComponent(bucket) + '?' + new URLSearchParams({ versions: '', prefix: key, 'max-keys': '100' }));
  const versions = versionEntries(listed)
    .filter((n) => text(n, 'Key') === key)
    .map((v) => versionRow(bucket, v, v.tagName === 'DeleteMarker', dir, () => objectPage(bucket, key)));
  show(el('h1', { class: 'crumbs' }, el('a', { href: '#/b/' + encodeURIComponent(bucket) + '/' + enc(dir) }, bucket + '/' + dir), key.slice(dir.length)),
    el('div', { class: 'row' },
      el('button', { class: 'primary', onclick: () => download(bucket, key) }, 'Download'),
      el('button', { class: 'danger', onclick: () => deleteObject(bucket, key, dir) }, 'Delete')),
    el('h2', {}, 'Metadata'), el('table', { id: 'metadata' }, rows),
    el('h2', {}, 'Versions'), el('table', { id: 'object-versions' }, versions),
    el('h2', {}, 'Tags'), ta,
    el('div', { class: 'row' }, el('button', {
      id: 'save-tags', onclick: async () => {
        const pairs = ta.value.split('\n').map((l) => l.trim()).filter(Boolean).map((l) => l.split('='));
        const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
        const body = '<Tagging><TagSet>' + pairs.map(([k, ...v]) => '<Tag><Key>' + esc(k) + '</Key><Value>' + esc(v.join('=')) + '</Value></Tag>').join('') + '</TagSet></Tagging>';
        try { await call('PUT', path + '?tagging', { body, headers: { 'content-type': 'application/xml' } }); flash('Tags saved', true); } catch (e) { flash(e.message); }
      },
    }, 'Save tags')));
}

// ---- keys (root)

async function keysPage(created) {
  const keys = await admin('GET', 'keys');
  const name = el('input', { type: 'text', id: 'key-name', placeholder: 'display name' });
  show(el('h1', {}, 'Users and keys'),
    created ? el('div', { class: 'card', id: 'key-created' },
      el('strong', {}, 'Created a key for ' + created.name + '. The secret is shown this once:'),
      el('pre', {}, 'access key: ' + created.access_key + '\nsecret key: ' + created.secret_key)) : '',
    el('div', { class: 'row' }, name, el('button', {
      class: 'primary', id: 'key-create', onclick: async () => {
        try { keysPage(await admin('POST', 'keys', { name: name.value.trim() })); } catch (e) { flash(e.message); }
      },
    }, 'Create key')),
    el('table', { id: 'keys' }, el('tr', {}, el('th', {}, 'Access key'), el('th', {}, 'Name'), el('th', {}, 'Root'), el('th', {}, '')),
      keys.map((k) => el('tr', { 'data-key': k.access_key }, el('td', {}, k.access_key), el('td', {}, k.name), el('td', {}, k.is_root ? 'yes' : ''),
        el('td', {}, k.is_root ? '' : el('button', {
          class: 'danger', onclick: async () => {
            if (!confirm('Delete key ' + k.access_key + '?')) return;
            try { await call('DELETE', '/_packrat/admin/keys/' + encodeURIComponent(k.access_key)); keysPage(); } catch (e) { flash(e.message); }
          },
        }, 'Delete'))))));
}

// ---- storage (root)

function table(obj) {
  if (obj === null || typeof obj !== 'object') return String(obj);
  if (Array.isArray(obj)) {
    if (!obj.length) return '(none)';
    if (typeof obj[0] !== 'object') return obj.join(', ');
    const cols = Object.keys(obj[0]);
    return el('table', {}, el('tr', {}, cols.map((c) => el('th', {}, c))), obj.map((r) => el('tr', {}, cols.map((c) => el('td', {}, table(r[c]))))));
  }
  return el('table', {}, Object.entries(obj).map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, table(v)))));
}

async function storagePage() {
  const [status, tiers] = await Promise.all([admin('GET', 'status'), admin('GET', 'tier').catch((e) => ({ error: e.message }))]);
  const out = el('pre', { id: 'job-result' }, '');
  const job = (label, fn) => el('button', {
    onclick: async () => {
      out.textContent = label + '...';
      try { out.textContent = JSON.stringify(await fn(), null, 2); } catch (e) { out.textContent = label + ' failed: ' + e.message; }
    },
  }, label);
  show(el('h1', {}, 'Storage'),
    el('div', { class: 'row' },
      job('Compact now', () => admin('POST', 'compact')),
      job('Start scrub', () => admin('POST', 'scrub')),
      job('Run tiers now', () => admin('POST', 'tier/run?days_ahead=0'))),
    out,
    el('h2', {}, 'Disks, segments, erasure coding, index'), el('div', { id: 'status' }, table(status)),
    el('h2', {}, 'Tiers'), el('div', { id: 'tiers' }, table(tiers)));
}

// ---- live metrics

function parseMetrics(body) {
  const sums = {};
  for (const line of body.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m) sums[m[1]] = (sums[m[1]] || 0) + Number(m[3]);
  }
  return sums;
}

function chart(canvas, values, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext('2d');
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const max = Math.max(1e-9, ...values);
  g.strokeStyle = '#e3e6eb';
  for (let i = 0; i <= 4; i++) { const y = 10 + (h - 30) * i / 4; g.beginPath(); g.moveTo(40, y); g.lineTo(w, y); g.stroke(); }
  g.fillStyle = '#667085'; g.font = '11px sans-serif';
  g.fillText(max.toPrecision(3) + ' ' + unit, 2, 12);
  g.fillText('0', 2, h - 20);
  g.strokeStyle = '#2f6fdb'; g.lineWidth = 2; g.beginPath();
  values.forEach((v, i) => {
    const x = 40 + (w - 40) * i / Math.max(1, values.length - 1);
    const y = 10 + (h - 30) * (1 - v / max);
    if (i) g.lineTo(x, y); else g.moveTo(x, y);
  });
  g.stroke();
}

function stopMetrics() { if (metricsTimer) { clearInterval(metricsTimer); metricsTimer = null; } }

function metricsPage() {
  const series = { rps: [], mbps: [], lat: [] };
  const canv = { rps: el('canvas', { id: 'chart-rps' }), mbps: el('canvas', { id: 'chart-mbps' }), lat: el('canvas', { id: 'chart-lat' }) };
  const figs = { rps: el('div', { class: 'figure', id: 'fig-rps' }, '-'), mbps: el('div', { class: 'figure', id: 'fig-mbps' }, '-'), lat: el('div', { class: 'figure', id: 'fig-lat' }, '-') };
  const card = (title, k) => el('div', { class: 'card' }, el('h2', {}, title), figs[k], canv[k]);
  show(el('h1', {}, 'Live'), el('p', { class: 'muted' }, 'From this server\'s /metrics, every 2 seconds.'),
    el('div', { class: 'charts' }, card('Requests per second', 'rps'), card('MB/s sent and received', 'mbps'), card('Mean latency (ms)', 'lat')));
  let last = null;
  const tick = async () => {
    let m;
    try { m = parseMetrics(await (await fetch('/metrics')).text()); } catch (e) { return; }
    const now = performance.now() / 1000;
    if (last) {
      const dt = Math.max(0.001, now - last.t);
      const d = (k) => Math.max(0, (m[k] || 0) - (last.m[k] || 0));
      const reqs = d('packrat_requests_total');
      const rps = reqs / dt;
      const mbps = (d('packrat_bytes_out_total') + d('packrat_bytes_in_total')) / dt / 1e6;
      const lat = reqs ? 1000 * d('packrat_request_duration_seconds_sum') / d('packrat_request_duration_seconds_count') : 0;
      for (const [k, v] of [['rps', rps], ['mbps', mbps], ['lat', lat]]) {
        series[k].push(v);
        if (series[k].length > 60) series[k].shift();
      }
      figs.rps.textContent = rps.toFixed(1) + ' req/s';
      figs.mbps.textContent = mbps.toFixed(2) + ' MB/s';
      figs.lat.textContent = lat.toFixed(2) + ' ms';
      chart(canv.rps, series.rps, 'req/s'); chart(canv.mbps, series.mbps, 'MB/s'); chart(canv.lat, series.lat, 'ms');
    }
    last = { t: now, m };
  };
  tick();
  metricsTimer = setInterval(tick, 2000);
}

// ---- routing

async function route() {
  stopMetrics();
  if (!me) { signInPage(); return; }
  const h = location.hash || '#/buckets';
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', h.startsWith(a.getAttribute('href')));
  const parts = h.slice(2).split('/');
  const rest = () => decodeURIComponent(parts.slice(2).join('/'));
  try {
    if (parts[0] === 'b') await objectsPage(decodeURIComponent(parts[1]), rest());
    else if (parts[0] === 'o') await objectPage(decodeURIComponent(parts[1]), rest());
    else if (parts[0] === 'v') await versionsPage(decodeURIComponent(parts[1]), rest());
    else if (parts[0] === 's') await settingsPage(decodeURIComponent(parts[1]));
    else if (parts[0] === 'keys') await keysPage();
    else if (parts[0] === 'storage') await storagePage();
    else if (parts[0] === 'metrics') metricsPage();
    else await bucketsPage();
  } catch (e) {
    if (me) flash(e.message);
  }
}

window.addEventListener('hashchange', () => { flash(''); route(); });
window.addEventListener('DOMContentLoaded', async () => {
  document.getElementById('signout').addEventListener('click', signOut);
  const r = await fetch('/console/session', { headers: CONSOLE, credentials: 'same-origin' });
  if (r.ok) { me = await r.json(); signedIn(); } else signInPage();
});
