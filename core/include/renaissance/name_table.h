// A printable name per enum value, as a table of rows, and the two lookups over such a table: a
// value's name and the value a text names. An enum's printer and its parser read one list.
#pragma once

#include <cstddef>
#include <string>

namespace renaissance {

template <typename E>
struct NameRow {
  E value;
  const char* name;
};

// True when row i holds the enumerator of value i: the rows follow the enum's order with no
// gap (static_assert'ed next to each table; an enumerator appended to the enum still needs its
// row, as it needed its case in the switch these tables replace).
// Serves any table of rows whose member `value` holds the enumerator (the kind and precision
// tables too).
template <typename Row, std::size_t N, typename E>
constexpr bool rows_in_enum_order(const Row (&rows)[N], E Row::*value) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(rows[i].*value) != i) return false;
  }
  return true;
}

template <typename E, std::size_t N>
constexpr bool rows_in_enum_order(const NameRow<E> (&rows)[N]) {
  return rows_in_enum_order(rows, &NameRow<E>::value);
}

// The name of `value` in `rows`, or `otherwise` where no row holds it.
template <typename E, std::size_t N>
const char* name_of(const NameRow<E> (&rows)[N], E value, const char* otherwise) {
  for (const NameRow<E>& row : rows) {
    if (row.value == value) return row.name;
  }
  return otherwise;
}

// Sets *out to the value (the member `value` of a row) of the first row whose `name` is `text`;
// false, *out untouched, where none is. Serves any table of rows with a `name` member.
template <typename Row, std::size_t N, typename E>
bool parse_by_name(const Row (&rows)[N], E Row::*value, const std::string& text, E* out) {
  for (const Row& row : rows) {
    if (text == row.name) {
      *out = row.*value;
      return true;
    }
  }
  return false;
}

template <typename E, std::size_t N>
bool parse_by_name(const NameRow<E> (&rows)[N], const std::string& text, E* out) {
  return parse_by_name(rows, &NameRow<E>::value, text, out);
}

}  // namespace renaissance
