import { cp, mkdtemp, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

/** A copy of this checkout's build inputs in a temporary directory, with no dist/. */
export interface CheckoutCopy {
  dir: string;
  remove(): Promise<void>;
}

/**
 * Everything `npm run build` and `npm run sample` read: the manifest, the build scripts and
 * configs, and each directory tsconfig.build.json includes.
 */
const BUILD_INPUTS = [
  'package.json',
  'tsconfig.json',
  'tsconfig.build.json',
  'tsconfig.commonjs.json',
  'scripts',
  'lib',
  'sample',
  'test/fixtures',
  'test/support',
];

/**
 * Copies the build inputs of the checkout at `from` into a fresh temporary directory, so a test
 * can make its build stale, or break it, without touching the dist/ that other test files of the
 * run load. node_modules is a link to the checkout's own (installing it again would take a minute).
 */
export async function copyCheckout(from = process.cwd()): Promise<CheckoutCopy> {
  const dir = await mkdtemp(join(tmpdir(), 'checkout-copy-'));
  await Promise.all(
    BUILD_INPUTS.map((path) => cp(resolve(from, path), join(dir, path), { recursive: true })),
  );
  await symlink(resolve(from, 'node_modules'), join(dir, 'node_modules'), 'dir');
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}
