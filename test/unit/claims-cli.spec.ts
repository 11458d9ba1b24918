import { describe, expect, it } from '@jest/globals';
import { parseAge, parseClaimsArguments, UsageError } from '../../lib/cli/claims-arguments.parser.js';
import { formatClaimsTable, formatDuration } from '../../lib/cli/claims-output.formatter.js';
import type { ClaimRecord } from '../../lib/interfaces/index.js';

describe('claims CLI arguments', () => {
  it('parses each command with the module defaults', () => {
    expect(parseClaimsArguments(['claims', 'list'])).toEqual({
      command: 'list',
      schema: undefined,
      table: undefined,
      maxAttempts: 5,
      json: false,
      list: { status: undefined, scope: undefined, olderThanMs: undefined, limit: 100 },
    });
    expect(
      parseClaimsArguments([
        'claims',
        'list',
        '--status=expired',
        '--scope',
        'Billing.paid',
        '--older-than',
        '1.5h',
        '--limit',
        '7',
        '--schema',
        'ops',
        '--table',
        'claims',
        '--max-attempts',
        '3',
        '--json',
      ]),
    ).toEqual({
      command: 'list',
      schema: 'ops',
      table: 'claims',
      maxAttempts: 3,
      json: true,
      list: { status: 'expired', scope: 'Billing.paid', olderThanMs: 5_400_000, limit: 7 },
    });
    expect(parseClaimsArguments(['claims', 'forget', 'Billing.paid', 'evt_1', '--force'])).toMatchObject({
      command: 'forget',
      scope: 'Billing.paid',
      key: 'evt_1',
      force: true,
    });
    expect(parseClaimsArguments(['claims', 'forget', 'Billing.paid', 'evt_1'])).toMatchObject({
      force: false,
    });
    // A key that starts with a dash comes after `--`.
    expect(
      parseClaimsArguments(['claims', 'show', '--json', '--', 'Billing.paid', '--odd-key']),
    ).toMatchObject({
      command: 'show',
      key: '--odd-key',
      json: true,
    });
    expect(parseClaimsArguments(['claims', 'release', 'x', 'y', '-h'])).toEqual({ command: 'help' });
  });

  it('takes ages as a number and a unit', () => {
    expect([parseAge('500ms'), parseAge('90s'), parseAge('10m'), parseAge('2h'), parseAge('1d')]).toEqual([
      500, 90_000, 600_000, 7_200_000, 86_400_000,
    ]);
    for (const bad of ['10', '10 m', '-5m', 'm', '1w', '']) expect(() => parseAge(bad)).toThrow(UsageError);
  });

  it('refuses what it cannot run, saying why', () => {
    const refused = (args: string[]) => {
      try {
        parseClaimsArguments(args);
      } catch (error) {
        expect(error).toBeInstanceOf(UsageError);
        return (error as Error).message;
      }
      throw new Error(`accepted ${args.join(' ')}`);
    };
    expect(refused(['claims', 'list', '--limit', '1e3'])).toBe(
      "--limit must be a whole number, 1 or more; got '1e3'",
    );
    expect(refused(['claims', 'list', '--json=yes'])).toContain("Option '--json' does not take an argument");
    expect(refused(['claims', 'list', '--scope'])).toContain("Option '--scope <value>' argument missing");
    expect(refused(['claims', 'forget', 'a'])).toBe('claims forget needs <scope> <key>');
    expect(refused(['claims', 'show', 'a', 'b', 'c'])).toBe('claims show needs <scope> <key>');
  });

  it('suggests the command, option or status a typo was near, as the module options do', () => {
    const refused = (args: string[]) => {
      try {
        parseClaimsArguments(args);
      } catch (error) {
        expect(error).toBeInstanceOf(UsageError);
        return (error as Error).message;
      }
      throw new Error(`accepted ${args.join(' ')}`);
    };
    expect(refused(['claims', 'lst'])).toBe("Unknown command 'claims lst'; did you mean 'claims list'?");
    expect(refused(['claims', 'relase', 's', 'k'])).toBe(
      "Unknown command 'claims relase'; did you mean 'claims release'?",
    );
    expect(refused(['clams', 'list'])).toBe("Unknown command 'clams'; did you mean 'claims'?");
    expect(refused(['list'])).toBe("Unknown command 'list'; did you mean 'claims list'?");
    expect(refused(['claims', 'list', '--stauts', 'failed'])).toBe(
      "Unknown option '--stauts'; did you mean --status?",
    );
    expect(refused(['claims', 'list', '--older_than=5m'])).toBe(
      "Unknown option '--older_than'; did you mean --older-than?",
    );
    expect(refused(['claims', 'list', '--status', 'expird'])).toBe(
      "--status must be one of in_progress, expired, failed, poison, done; got 'expird'; did you mean expired?",
    );
    // Nothing near: no guess.
    expect(refused(['claims', 'bogus'])).toBe("Unknown command 'claims bogus'");
    expect(refused(['claims', 'list', '--verbose'])).toMatch(/^Unknown option '--verbose'\. /);
    expect(refused(['claims', 'list', '--status', 'stuck'])).not.toContain('did you mean');
  });
});

describe('claims CLI output', () => {
  it('writes durations as their two largest units', () => {
    expect([0, 850, 42_000, 184_000, 3_600_000, 7_500_000, 277_200_000].map(formatDuration)).toEqual([
      '0ms',
      '850ms',
      '42s',
      '3m 4s',
      '1h 0m',
      '2h 5m',
      '3d 5h',
    ]);
  });

  it('escapes control characters of keys and errors, so a row stays one line', () => {
    const claim: ClaimRecord = {
      scope: 'Billing.paid',
      key: 'evt\n\u001b[31mred',
      source: 'stripe',
      status: 'failed',
      poison: true,
      attempts: 5,
      leaseToken: null,
      claimedAt: new Date(0),
      leaseExpiresAt: null,
      completedAt: null,
      ageMs: 65_000,
      leaseLeftMs: null,
      lastError: 'x'.repeat(80),
    };
    const lines = formatClaimsTable([claim], 100).trimEnd().split('\n');
    expect(lines).toHaveLength(3);
    expect(lines[1]).toContain('evt\\u000a\\u001b[31mred');
    expect(lines[1]).toContain('failed (poison)');
    expect(lines[1]).toContain('1m 5s');
    expect(lines[1].endsWith(`${'x'.repeat(57)}...`)).toBe(true);
    expect(lines[2]).toBe('1 claim');
  });
});
