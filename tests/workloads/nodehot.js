'use strict';
// bpfprof's Node.js workload: hotA does three times hotB's work, each in a loop of its own (so
// that V8 optimizes them while they run, on the stack), reached through three levels of the
// program's own functions. Usage: node nodehot.js SECONDS. With NODEHOT_TRUTH set, the wall time
// spent in hotA and in hotB so far (ns) is written there, "A B", as it goes.
const fs = require('fs');

function hotA(n) {
  let x = 0;
  for (let i = 0; i < 3 * n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function hotB(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

const spent = [0n, 0n];

function level3(n) {
  // Timed here rather than in a helper both go through: an optimized helper could inline them.
  const t0 = process.hrtime.bigint();
  const a = hotA(n);
  const t1 = process.hrtime.bigint();
  const b = hotB(n);
  spent[0] += t1 - t0;
  spent[1] += process.hrtime.bigint() - t1;
  return a + b;
}

function level2(n) {
  return level3(n);
}

function level1(n) {
  return level2(n);
}

const truth = process.env.NODEHOT_TRUTH;
const end = Date.now() + Number(process.argv[2] || 10) * 1000;
let sink = 0;
for (let round = 1; Date.now() < end; round++) {
  sink += level1(200000);
  if (truth && round % 10 === 0) {
    fs.writeFileSync(truth + '.tmp', `${spent[0]} ${spent[1]}\n`);
    fs.renameSync(truth + '.tmp', truth);
  }
}
process.stdout.write(sink >= 0 ? '' : '-');
