/**
 * Jest runs the TypeScript sources in native ESM through @swc/jest (ts-jest refuses TypeScript 7).
 * One PostgreSQL server per run (test/support/global-setup.mjs); each test file makes its own database.
 */
export default {
  testEnvironment: 'node',
  rootDir: '.',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.spec.ts', '**/*.e2e-spec.ts'],
  // The packaging tests' apps are run by their own test runners, from a temporary copy. The
  // model-based test takes minutes: `npm run test:model` runs it (jest.model.config.mjs).
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/test/packaging/apps/', '<rootDir>/test/model/'],
  modulePathIgnorePatterns: ['<rootDir>/test/packaging/apps/'],
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform: {
    '^.+\\.ts$': [
      '@swc/jest',
      {
        jsc: {
          parser: { syntax: 'typescript', decorators: true },
          transform: { legacyDecorator: true, decoratorMetadata: true, useDefineForClassFields: false },
          target: 'es2022',
        },
        module: { type: 'es6' },
      },
    ],
  },
  globalSetup: '<rootDir>/test/support/global-setup.mjs',
  globalTeardown: '<rootDir>/test/support/global-teardown.mjs',
  testTimeout: 60000,
  // Four workers on two cores: much of a test's time is spent waiting on child processes, timers
  // and PostgreSQL, and with two workers a sixth to a quarter of the CPU stayed idle. Measured
  // interleaved on the 2-core CI machine: two workers 382 s and 353 s (113-118 CPU-s idle), four
  // 330 s and 300 s (6 CPU-s idle), every run green.
  maxWorkers: 4,
};
