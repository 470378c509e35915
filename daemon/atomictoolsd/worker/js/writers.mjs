// Nothing is loaded that another user could have written (worker/sourceload.py's rule, for
// the helpers a module imports from its tools dir: the daemon checks the module file itself): a file
// owned by someone else (but root), writable by others, or in a directory others may write to
// without the sticky bit would let them run their code as you.

import { statSync } from "node:fs"
import { dirname } from "node:path"

// A path as a POSIX shell reads it back, whatever it holds (the fix printed is meant to be run).
const quoted = (path) => `'${path.replaceAll("'", "'\\''")}'`

export function checkWriters(path) {
  const me = process.getuid?.() ?? 0
  const info = statSync(path)
  if (info.uid !== me && info.uid !== 0) throw new Error(`refused to load ${path}: it belongs to uid ${info.uid}, not to you (uid ${me})`)
  if (info.mode & 0o002) throw new Error(`refused to load ${path}: other users can write it; run: chmod o-w ${quoted(path)}`)
  const directory = statSync(dirname(path))
  if (directory.mode & 0o002 && !(directory.mode & 0o1000)) {
    throw new Error(`refused to load ${path}: other users can write its directory; run: chmod o-w ${quoted(dirname(path))}`)
  }
}
