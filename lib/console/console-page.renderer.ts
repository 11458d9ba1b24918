import type { ClaimListStatus, ClaimRecord, DeadLetteredJob } from '../interfaces/index.js';
import { CSRF_FIELD } from './console-csrf.js';

/** The actions of the console: IdempotencyClaims' release and forget, HandoffQueues' retry. */
export type ConsoleAction = 'release' | 'forget' | 'retry';

/** One list of claims on the page. */
export interface ClaimSection {
  status: ClaimListStatus;
  claims: ClaimRecord[];
}

/** What the main page shows. */
export interface ConsolePageView {
  title: string;
  /** The console's URL path, for links and forms. */
  base: string;
  sections: ClaimSection[];
  /** Dead-lettered jobs; undefined without the `handoff` option. */
  deadLetters?: DeadLetteredJob[];
  limit: number;
  notice?: Notice;
}

/** The line at the top after an action: what it did, or why it changed nothing. */
export interface Notice {
  tone: 'ok' | 'refused';
  text: string;
}

/** What a confirmation page asks about. */
export interface ConfirmView {
  title: string;
  base: string;
  token: string;
  action: ConsoleAction;
  /** The claim a release or forget acts on, as it is now. */
  claim?: ClaimRecord;
  /** The job a retry acts on. */
  job?: DeadLetteredJob;
  /** The hidden fields the form posts back. */
  fields: Record<string, string>;
}

const SECTION_TEXT: Readonly<Record<ClaimListStatus, { title: string; hint: string }>> = {
  poison: {
    title: 'Poison events',
    hint: 'Not done after maxAttempts deliveries: the handler fails on every one. Read the last error and fix the cause.',
  },
  expired: {
    title: 'Expired leases',
    hint: 'In progress, but the lease ran out: the worker probably died. The next delivery re-claims it.',
  },
  failed: {
    title: 'Failed',
    hint: 'The last attempt failed; the next delivery claims it again.',
  },
  in_progress: {
    title: 'In flight',
    hint: 'A delivery holds a live lease. Release one only when its worker is stuck or dead.',
  },
  done: { title: 'Done', hint: 'Processed.' },
};

const CONSEQUENCES: Readonly<Record<ConsoleAction, { verb: string; text: string }>> = {
  release: {
    verb: 'Release the lease',
    text:
      'The claim becomes failed and its next delivery claims it at once (attempt + 1). If its worker is still ' +
      'running, that worker finds its lease lost when it finishes, and its side effect may then run twice.',
  },
  forget: {
    verb: 'Forget the claim',
    text:
      'The claim is deleted: the next delivery of this event runs the handler again, as a first delivery, ' +
      'and its effect happens again.',
  },
  retry: {
    verb: 'Retry the job',
    text:
      'The job leaves its dead-letter queue and is queued again with its data and fresh retries; a worker runs ' +
      'it under its claim, so its event still has one effect.',
  },
};

/** Text for HTML: every character that could open markup or leave an attribute is escaped. */
export function escapeHtml(value: unknown): string {
  return String(value ?? '')
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&#39;');
}

/** `1.2 s`, `3 min`, `5 h`, `2 d`. */
export function humanDuration(ms: number | null): string {
  if (ms === null) return '';
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(ms < 10_000 ? 1 : 0)} s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)} min`;
  if (ms < 86_400_000) return `${Math.round(ms / 3_600_000)} h`;
  return `${Math.round(ms / 86_400_000)} d`;
}

const query = (fields: Record<string, string>) => new URLSearchParams(fields).toString();

/** The stylesheet, inline (the page loads nothing else: its CSP allows no other source). */
const STYLE = `
:root { color-scheme: light; --ink: #1d2330; --muted: #5b6475; --line: #dde1e8; --bad: #b42318; --warn: #b54708; --ok: #067647; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 14px 24px; display: flex; align-items: baseline; gap: 16px; }
header h1 { font-size: 18px; margin: 0; }
header .sub { color: #c4c9d4; font-size: 13px; }
main { padding: 16px 24px 40px; max-width: 1280px; }
.summary { display: flex; gap: 12px; flex-wrap: wrap; margin: 0 0 16px; padding: 0; list-style: none; }
.summary li { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 120px; }
.summary a { color: inherit; text-decoration: none; }
.summary b { display: block; font-size: 22px; }
.summary .hot b { color: var(--bad); }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; margin: 0 0 16px; }
section h2 { font-size: 15px; margin: 0; padding: 12px 16px 2px; }
section p.hint { margin: 0; padding: 0 16px 10px; color: var(--muted); }
table { width: 100%; border-collapse: collapse; }
th, td { text-align: left; padding: 7px 16px; border-top: 1px solid var(--line); vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); font-weight: 600; }
td.key, td.scope { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; word-break: break-all; }
td.error { color: var(--bad); max-width: 360px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.empty { color: var(--muted); padding: 10px 16px 14px; margin: 0; }
.badge { display: inline-block; border-radius: 10px; padding: 1px 8px; font-size: 12px; background: #eef0f4; }
.badge.poison { background: #fee4e2; color: var(--bad); }
.badge.expired { background: #fef0c7; color: var(--warn); }
a.action, button { display: inline-block; font: inherit; font-size: 13px; padding: 4px 10px; border-radius: 6px; border: 1px solid #b9c0cc; background: #fff; color: var(--ink); text-decoration: none; cursor: pointer; margin: 0 4px 4px 0; }
a.action.danger, button.danger { border-color: var(--bad); color: var(--bad); }
button.danger { background: var(--bad); color: #fff; }
.notice { border-radius: 8px; padding: 10px 14px; margin: 0 0 16px; border: 1px solid; }
.notice.ok { background: #ecfdf3; border-color: #abefc6; color: var(--ok); }
.notice.refused { background: #fffaeb; border-color: #fedf89; color: var(--warn); }
.confirm { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px; max-width: 760px; }
.confirm dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; }
.confirm dt { color: var(--muted); }
.confirm dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
`;

function page(title: string, subtitle: string, body: string): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>${escapeHtml(title)}</title>
<style>${STYLE}</style>
</head>
<body>
<header><h1>${escapeHtml(title)}</h1><span class="sub">${escapeHtml(subtitle)}</span></header>
<main>
${body}
</main>
</body>
</html>
`;
}

function actionLink(
  base: string,
  action: ConsoleAction,
  fields: Record<string, string>,
  label: string,
): string {
  const danger = action === 'retry' ? '' : ' danger';
  return `<a class="action${danger}" href="${escapeHtml(`${base}/confirm?${query({ action, ...fields })}`)}">${escapeHtml(label)}</a>`;
}

function claimActions(base: string, claim: ClaimRecord): string {
  const fields = { scope: claim.scope, key: claim.key };
  const actions: string[] = [];
  if (claim.status === 'in_progress' || claim.status === 'expired') {
    actions.push(actionLink(base, 'release', fields, 'Release'));
  }
  if (claim.status !== 'in_progress') actions.push(actionLink(base, 'forget', fields, 'Forget'));
  return actions.join('');
}

function claimRow(base: string, claim: ClaimRecord): string {
  const state = claim.poison ? 'poison' : claim.status;
  return `<tr data-scope="${escapeHtml(claim.scope)}" data-key="${escapeHtml(claim.key)}">
<td class="scope">${escapeHtml(claim.scope)}</td>
<td class="key">${escapeHtml(claim.key)}</td>
<td><span class="badge ${escapeHtml(state)}">${escapeHtml(claim.status.replace('_', ' '))}</span></td>
<td class="num">${claim.attempts}</td>
<td class="num" title="${escapeHtml(claim.claimedAt.toISOString())}">${humanDuration(claim.ageMs)}</td>
<td class="num">${humanDuration(claim.leaseLeftMs)}</td>
<td class="error">${escapeHtml(claim.lastError ?? '')}</td>
<td>${claimActions(base, claim)}</td>
</tr>`;
}

function claimSection(base: string, section: ClaimSection, limit: number): string {
  const { title, hint } = SECTION_TEXT[section.status];
  const more = section.claims.length >= limit ? ` (the ${limit} most recent)` : '';
  const body =
    section.claims.length === 0
      ? '<p class="empty">None.</p>'
      : `<table>
<thead><tr><th>Scope</th><th>Key</th><th>Status</th><th>Attempts</th><th>Age</th><th>Lease left</th><th>Last error</th><th></th></tr></thead>
<tbody>
${section.claims.map((claim) => claimRow(base, claim)).join('\n')}
</tbody>
</table>`;
  return `<section id="${section.status}" aria-label="${escapeHtml(title)}">
<h2>${escapeHtml(title)}${more}</h2>
<p class="hint">${escapeHtml(hint)}</p>
${body}
</section>`;
}

function deadLetterSection(base: string, jobs: DeadLetteredJob[], limit: number): string {
  const more = jobs.length >= limit ? ` (the ${limit} oldest)` : '';
  const rows = jobs.map((job) => {
    // A dead-letter queue may serve several queues: the job can go back to any of them.
    const queues = job.queue.split(', ');
    const actions = queues
      .map((queue) =>
        actionLink(base, 'retry', { queue, id: job.id }, queues.length > 1 ? `Retry in ${queue}` : 'Retry'),
      )
      .join('');
    return `<tr data-job="${escapeHtml(job.id)}">
<td class="scope">${escapeHtml(job.queue)}</td>
<td class="key">${escapeHtml(job.event?.key ?? '')}</td>
<td class="key">${escapeHtml(job.id)}</td>
<td class="num" title="${escapeHtml(job.createdAt.toISOString())}">${humanDuration(Date.now() - job.createdAt.getTime())}</td>
<td class="error">${escapeHtml(job.lastError ?? '')}</td>
<td>${actions}</td>
</tr>`;
  });
  const body =
    jobs.length === 0
      ? '<p class="empty">None.</p>'
      : `<table>
<thead><tr><th>Queue</th><th>Event key</th><th>Job</th><th>Age</th><th>Last error</th><th></th></tr></thead>
<tbody>
${rows.join('\n')}
</tbody>
</table>`;
  return `<section id="dead-letters" aria-label="Dead-lettered jobs">
<h2>Dead-lettered jobs${more}</h2>
<p class="hint">Handoff jobs that failed on every retry. Retry one once its cause is fixed.</p>
${body}
</section>`;
}

/** The console's page: claims by state, dead-lettered jobs, and the last action's notice. */
export function renderConsolePage(view: ConsolePageView): string {
  const counts = view.sections.map(({ status, claims }) => {
    const { title } = SECTION_TEXT[status];
    const hot = claims.length > 0 && status !== 'in_progress' ? ' class="hot"' : '';
    const shown = claims.length >= view.limit ? `${claims.length}+` : String(claims.length);
    return `<li${hot}><a href="#${status}"><b>${shown}</b>${escapeHtml(title)}</a></li>`;
  });
  if (view.deadLetters) {
    const hot = view.deadLetters.length > 0 ? ' class="hot"' : '';
    counts.push(
      `<li${hot}><a href="#dead-letters"><b>${view.deadLetters.length}</b>Dead-lettered jobs</a></li>`,
    );
  }
  const notice = view.notice
    ? `<p class="notice ${view.notice.tone}" role="status">${escapeHtml(view.notice.text)}</p>`
    : '';
  const body = [
    notice,
    `<ul class="summary">${counts.join('')}</ul>`,
    ...view.sections.map((section) => claimSection(view.base, section, view.limit)),
    ...(view.deadLetters ? [deadLetterSection(view.base, view.deadLetters, view.limit)] : []),
  ].join('\n');
  return page(view.title, `claims and handoff jobs · ${new Date().toISOString()}`, body);
}

/** The confirmation of one action: what it acts on, what it will do, and the form that does it. */
export function renderConfirmPage(view: ConfirmView): string {
  const { verb, text } = CONSEQUENCES[view.action];
  const details: [string, string][] = view.claim
    ? [
        ['Scope', view.claim.scope],
        ['Key', view.claim.key],
        ['Status', view.claim.status],
        ['Attempts', String(view.claim.attempts)],
        ['Last claimed', `${humanDuration(view.claim.ageMs)} ago`],
        ['Lease left', humanDuration(view.claim.leaseLeftMs) || '—'],
        ['Last error', view.claim.lastError ?? '—'],
      ]
    : view.job
      ? [
          ['Queue', view.fields.queue ?? view.job.queue],
          ['Job', view.job.id],
          ['Event', view.job.event ? `${view.job.event.key} (${view.job.event.scope})` : '—'],
          ['Last error', view.job.lastError ?? '—'],
        ]
      : [];
  const hidden = Object.entries({ ...view.fields, [CSRF_FIELD]: view.token })
    .map(([name, value]) => `<input type="hidden" name="${escapeHtml(name)}" value="${escapeHtml(value)}">`)
    .join('\n');
  const body = `<div class="confirm">
<h2>${escapeHtml(verb)}?</h2>
<dl>${details.map(([term, value]) => `<dt>${escapeHtml(term)}</dt><dd>${escapeHtml(value)}</dd>`).join('')}</dl>
<p>${escapeHtml(text)}</p>
<form method="post" action="${escapeHtml(`${view.base}/actions/${view.action}`)}">
${hidden}
<button type="submit" class="danger">${escapeHtml(verb)}</button>
<a class="action" href="${escapeHtml(view.base)}">Cancel</a>
</form>
</div>`;
  return page(view.title, 'confirm an action', body);
}

/** A page that says why nothing was done (a refused form, a claim or job not found). */
export function renderMessagePage(title: string, base: string, heading: string, message: string): string {
  return page(
    title,
    heading,
    `<div class="confirm"><h2>${escapeHtml(heading)}</h2><p>${escapeHtml(message)}</p><a class="action" href="${escapeHtml(base)}">Back to the console</a></div>`,
  );
}
