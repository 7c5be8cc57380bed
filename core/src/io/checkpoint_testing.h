// Test hooks of the atomic file writer (core/src/atomic_file.cc) behind Task::save and the
// safetensors writer. Not part of the public API: the unit tests include this file to make one
// file-system operation of a save fail, so that the write-error guarantee is testable without a
// full disk or root.
#pragma once

namespace renaissance {
namespace checkpoint_testing {

// From the next Task::save on, operation number `n` (1-based; counted from the start of each
// save: create the temporary file, each write(), fsync, close, rename, open the folder, fsync
// the folder) fails with errno `err`. n = 0 turns the fault off. Applies to every later save
// until it is turned off.
void inject_fault(int n, int err);

// How many file-system operations the last Task::save performed (or reached, when it failed).
int last_save_operations();

// The operation numbers of the rename and of the folder fsync in the last save, so tests can
// tell "before the rename" (the old checkpoint must be intact) from "after it".
int last_save_rename_operation();

}  // namespace checkpoint_testing
}  // namespace renaissance
