import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { baselinePairs, type BaselinePairs } from '../baseline-pairs.js';

/**
 * What decides whether the baseline can share the current side's database: the schema both
 * servers write to. Compared between the baseline commit and the current working tree.
 */
const SCHEMA_FILES = [
  'lib/migrations',
  'bench/server/hand-written.sql.ts',
  'test/support/migrated-database.ts',
];
/** The baseline's bench server and its protocol; if they differ, its raw-* routes are not the same code. */
const SERVER_FILES = ['bench/server', 'bench/support/server-protocol.ts'];

/** The library and bench server as they were at a git ref, checked out and compiled beside the current one. */
export interface BaselineCheckout {
  /** The ref as given (`--baseline`), and the commit it names. */
  ref: string;
  commit: string;
  subject: string;
  /** The current side: HEAD, and whether lib/ or bench/ have uncommitted changes (measured as they are). */
  current: { commit: string; dirty: boolean };
  /** The temporary worktree. */
  dir: string;
  /** The baseline's own compiled bench server. */
  serverEntry: string;
  /** The migration and the bench schema are the same files as the current ones. */
  sameSchema: boolean;
  /** bench/server or the server protocol differ from the current ones. */
  serverChanged: boolean;
  /** The pairs of BASELINE_PAIRS it has both routes of (measured on both servers), and the others. */
  pairs: BaselinePairs;
  /** A fresh database made by the baseline's own code (its migration, its bench schema). */
  createDatabase(adminUrl: string): Promise<{ url: string; name: string }>;
  /** Removes the worktree; safe to call twice, synchronous so it also runs on SIGINT. */
  remove(): void;
}

function git(cwd: string, args: string[]): string {
  return execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
}

/** Whether `paths` are the same at `commit` as in the working tree. */
function sameAs(repoDir: string, commit: string, paths: string[]): boolean {
  try {
    git(repoDir, ['diff', '--quiet', commit, '--', ...paths]);
    return true;
  } catch {
    return false; // exit code 1: they differ
  }
}

/**
 * `git worktree add --detach` of `ref` into a temporary directory, the main checkout's
 * node_modules linked into it (the dependencies are compatible), and its lib + bench compiled there
 * with its own tsconfig.bench.json, as its own `npm run bench` would; its own VARIANTS say which
 * routes its bench server has. The caller removes it.
 */
export async function checkoutBaseline(ref: string, repoDir: string): Promise<BaselineCheckout> {
  let commit: string;
  try {
    commit = git(repoDir, ['rev-parse', '--verify', `${ref}^{commit}`]);
  } catch {
    throw new Error(`--baseline ${ref}: not a commit in ${repoDir}`);
  }
  const subject = git(repoDir, ['log', '-1', '--format=%s', commit]);
  const current = {
    commit: git(repoDir, ['rev-parse', 'HEAD']),
    dirty: git(repoDir, ['status', '--porcelain', '--', 'lib', 'bench', ':(exclude)bench/results']) !== '',
  };
  const dir = mkdtempSync(join(tmpdir(), 'idempotency-bench-baseline-'));
  let added = false;
  const remove = () => {
    if (added) {
      // --force: the node_modules symlink and dist/ are untracked.
      try {
        git(repoDir, ['worktree', 'remove', '--force', dir]);
      } catch {
        // removed below, and pruned
      }
      added = false;
    }
    rmSync(dir, { recursive: true, force: true });
    try {
      git(repoDir, ['worktree', 'prune']);
    } catch {
      // nothing to prune
    }
  };
  try {
    git(repoDir, ['worktree', 'add', '--detach', dir, commit]);
    added = true;
    symlinkSync(join(repoDir, 'node_modules'), join(dir, 'node_modules'), 'dir');
    if (!existsSync(join(dir, 'tsconfig.bench.json')) || !existsSync(join(dir, 'bench/server/main.ts'))) {
      throw new Error(`--baseline ${ref}: ${commit.slice(0, 7)} has no bench server (bench/server/main.ts)`);
    }
    console.log(`[bench] baseline ${ref} (${commit.slice(0, 7)} ${subject}): compiling in ${dir}`);
    try {
      execFileSync(
        process.execPath,
        ['node_modules/typescript-native/bin/tsc', '-p', 'tsconfig.bench.json'],
        {
          cwd: dir,
          encoding: 'utf8',
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
    } catch (error) {
      const { stdout, stderr } = error as { stdout?: string; stderr?: string };
      throw new Error(`--baseline ${ref}: its bench did not compile:\n${stdout ?? ''}${stderr ?? ''}`, {
        cause: error,
      });
    }
    const serverEntry = join(dir, 'dist/bench/server/main.js');
    if (!existsSync(serverEntry)) throw new Error(`--baseline ${ref}: compiling produced no ${serverEntry}`);
    const variants = join(dir, 'dist/bench/variants.js');
    const routes = existsSync(variants)
      ? ((await import(pathToFileURL(variants).href)) as { VARIANTS?: readonly string[] }).VARIANTS
      : undefined;
    return {
      ref,
      commit,
      subject,
      current,
      dir,
      serverEntry,
      sameSchema: sameAs(repoDir, commit, SCHEMA_FILES),
      serverChanged: !sameAs(repoDir, commit, SERVER_FILES),
      pairs: baselinePairs(routes),
      createDatabase: async (adminUrl) => {
        const module = (await import(
          pathToFileURL(join(dir, 'dist/bench/support/bench-postgres.js')).href
        )) as {
          createBenchDatabase?: (adminUrl: string) => Promise<{ url: string; name: string }>;
        };
        if (!module.createBenchDatabase)
          throw new Error(`--baseline ${ref}: its bench has no createBenchDatabase`);
        return module.createBenchDatabase(adminUrl);
      },
      remove,
    };
  } catch (error) {
    remove();
    throw error;
  }
}
