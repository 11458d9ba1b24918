import { describe, expect, it } from '@jest/globals';
import { claimTable } from '../../lib/postgres/claim-table.js';
import {
  claimStatements,
  claimWithCompanions,
  statementName,
  type ClaimStatements,
} from '../../lib/postgres/claim.sql.js';
import { orderedClaimStatements } from '../../lib/postgres/ordered-claim.sql.js';
import { versionTable } from '../../lib/postgres/version-table.js';

/** Every named statement of a table's set, by role. */
function named(statements: ClaimStatements): [string, { name: string; text: string }][] {
  return Object.entries(statements).filter(([role]) => role !== 'table') as [
    string,
    { name: string; text: string },
  ][];
}

/** PostgreSQL cuts identifiers at 63 bytes: two names equal up to there would be one statement. */
const MAX_IDENTIFIER_BYTES = 63;

/**
 * The names statements are prepared under carry a hash of their text: a connection that holds
 * another release's (or another copy's) statement under a name can never be taken to hold ours.
 */
describe('prepared statement names', () => {
  const TEXT = 'SELECT status FROM "processed_events" WHERE scope = $1 AND event_key = $2';

  it('stay the same for the same role and text, in every call', () => {
    expect(statementName('claim_state', TEXT)).toBe(statementName('claim_state', TEXT));
    expect(statementName('claim_state', TEXT)).toMatch(/^idempotency_claim_state_[0-9a-f]{16}$/);
    // Built twice from scratch, the set's names agree: two processes of one release share them.
    const once = named(claimStatements(claimTable(undefined))).map(([role, { name }]) => [role, name]);
    const again = named(claimStatements(claimTable(undefined))).map(([role, { name }]) => [role, name]);
    expect(again).toEqual(once);
  });

  it('differ when only the text differs, even by one character or by whitespace', () => {
    const base = statementName('claim_state', TEXT);
    expect(statementName('claim_state', TEXT.replace('$2', '$3'))).not.toBe(base);
    expect(statementName('claim_state', `${TEXT} `)).not.toBe(base);
    expect(statementName('claim_state', TEXT.replace('status', 'Status'))).not.toBe(base);
    // And when only the role differs.
    expect(statementName('current_attempt', TEXT)).not.toBe(base);
  });

  it('differ when only the count of values a statement is sent with differs', () => {
    // A SQL-level PREPARE declares its parameters: the same text declared with two and with five
    // is two statements, and an EXECUTE of one with the other's count of values fails.
    const base = statementName('claim_at_commit', TEXT);
    expect(statementName('claim_at_commit', TEXT, 2)).not.toBe(base);
    expect(statementName('claim_at_commit', TEXT, 2)).not.toBe(statementName('claim_at_commit', TEXT, 5));
    const { claimAtCommit, claimAtCommitInsert, storeResponse } = claimStatements(
      claimTable(undefined),
      true,
    );
    expect(claimAtCommit).toEqual(
      claimWithCompanions('claim_at_commit', claimAtCommit!.text, 2, [
        { role: 'claim_at_commit_insert', statement: claimAtCommitInsert! },
        { role: 'store_response', statement: storeResponse! },
      ]),
    );
    expect(claimAtCommit!.parameters).toBe(2);
  });

  it('differ when only the statements prepared with one differ', () => {
    // A session holding the claim at commit under its name was given its insert by the same query;
    // another release's claim, prepared without it (or with another), must not share the name.
    const { claimAtCommit, claimAtCommitInsert } = claimStatements(claimTable(undefined), true);
    const { text } = claimAtCommit!;
    const insert = { role: 'claim_at_commit_insert', statement: claimAtCommitInsert! };
    const other = {
      role: 'claim_at_commit_insert',
      statement: { name: 'x', text: `${claimAtCommitInsert!.text} ` },
    };
    const names = [
      claimAtCommit!.name,
      statementName('claim_at_commit', text, 2),
      claimWithCompanions('claim_at_commit', text, 2, [insert]).name,
      claimWithCompanions('claim_at_commit', text, 2, [other]).name,
      claimWithCompanions('claim_at_commit', text, 2, [insert, other]).name,
    ];
    expect(new Set(names).size).toBe(names.length);
  });

  it("name a claim's companions for that claim: another claim, or another wording of it, prepares them under other names", () => {
    // Two claims PREPAREing one name on a session: the second would meet the first's (42P05), and
    // could not tell whether its own statement is there. So the statement every checked claim
    // carries (storeResponse) has a name with each, and a release that rewords a claim renames its
    // companions even where their own text is unchanged.
    const table = claimTable(undefined);
    const checked = claimStatements(table, true);
    const ordered = orderedClaimStatements(table, versionTable(table), true, checked.storeResponse);
    const claims = [checked.transactionClaim, checked.claimAtCommit!, ordered.applyEqual, ordered.staleEqual];
    const stores = claims.flatMap((claim) =>
      claim.companions!.filter((companion) => companion.text === checked.storeResponse!.text),
    );
    expect(stores).toHaveLength(claims.length);
    const names = [checked.storeResponse!.name, ...stores.map((store) => store.name)];
    expect(new Set(names).size).toBe(names.length);
    for (const name of names) expect(name).toMatch(/^idempotency_store_response_[0-9a-f]{16}$/);

    const reworded = claimWithCompanions('claim_at_commit', `${checked.claimAtCommit!.text} `, 2, [
      { role: 'claim_at_commit_insert', statement: checked.claimAtCommitInsert! },
      { role: 'store_response', statement: checked.storeResponse! },
    ]);
    const before = checked.claimAtCommit!.companions!.map((companion) => companion.name);
    for (const companion of reworded.companions!) expect(before).not.toContain(companion.name);
  });

  it("differ between statements of different texts, across a set and two tables' sets", () => {
    const standard = named(claimStatements(claimTable(undefined)));
    const billing = named(claimStatements(claimTable('billing', 'webhook_claims')));
    const all = [...standard, ...billing];
    // One name per text: a statement that names no table (restoring lock_timeout) is the same
    // statement for both tables and may share its name; any two texts that differ may not.
    const texts = new Map(all.map(([, statement]) => [statement.name, statement.text]));
    expect(texts.size).toBe(new Set(all.map(([, statement]) => statement.text)).size);
    expect(standard.filter(([, statement]) => statement.text.includes('"processed_events"'))).toHaveLength(
      standard.length - 1,
    );
    for (const [role, statement] of all) {
      // Each name is the one its role and its own text give, and fits in an identifier uncut.
      const snake = role.replace(/[A-Z]/g, (letter) => `_${letter.toLowerCase()}`);
      expect(statement.name).toBe(statementName(snake, statement.text));
      expect(Buffer.byteLength(statement.name)).toBeLessThanOrEqual(MAX_IDENTIFIER_BYTES);
    }
  });

  it('never give the transaction claim the name the previous release used, whatever the table', () => {
    for (const table of [claimTable(undefined), claimTable('billing', 'webhook_claims')]) {
      const { transactionClaim } = claimStatements(table);
      expect(transactionClaim.name).not.toBe('idempotency_transaction_claim');
      expect(transactionClaim.name.startsWith('idempotency_transaction_claim_')).toBe(true);
    }
  });
});
