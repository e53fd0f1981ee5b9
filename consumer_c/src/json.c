/* The hello's and ACCEPT's JSON: a flat object of strings, numbers and arrays of numbers,
 * written by the node. A small scanner, not a general parser: nested objects are skipped. */
#include <string.h>

#include "internal.h"

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The end of a string starting after its opening quote: the index of the closing quote. */
static size_t string_end(const char *s, size_t i, size_t n) {
    while (i < n && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
    return i;
}

/* The end of any value at i (one past it), nested brackets and strings skipped. */
static size_t value_end(const char *s, size_t i, size_t n) {
    int depth = 0;
    while (i < n) {
        char ch = s[i];
        if (ch == '"') {
            i = string_end(s, i + 1, n) + 1;
            if (depth == 0) return i;
            continue;
        }
        if (ch == '[' || ch == '{') depth++;
        if (ch == ']' || ch == '}') {
            if (depth == 0) return i;
            if (--depth == 0) return i + 1;
        }
        if (depth == 0 && (ch == ',' || ch == '}')) return i;
        i++;
    }
    return i;
}

int vp_json_object(const char *s, size_t n, vp_json_field field, void *user) {
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{') return -1;
    i++;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i < n && s[i] == '}') return 0;
        if (i >= n || s[i] != '"') return -1;
        size_t k0 = i + 1, k1 = string_end(s, k0, n);
        if (k1 >= n) return -1;
        char key[64];
        size_t klen = k1 - k0 < sizeof key - 1 ? k1 - k0 : sizeof key - 1;
        memcpy(key, s + k0, klen);
        key[klen] = 0;
        i = skip_ws(s, k1 + 1, n);
        if (i >= n || s[i] != ':') return -1;
        i = skip_ws(s, i + 1, n);
        size_t end = value_end(s, i, n);
        if (end > n || end == i) return -1;
        char ch = s[i];
        if (ch == '"')
            field(key, 's', s + i + 1, end - i - 2, user);
        else if (ch == '[')
            field(key, 'a', s + i + 1, end - i - 2, user);
        else if (ch == '-' || (ch >= '0' && ch <= '9'))
            field(key, 'n', s + i, end - i, user);
        else
            field(key, 'o', s + i, end - i, user);
        i = skip_ws(s, end, n);
        if (i < n && s[i] == ',') {
            i++;
            continue;
        }
        if (i < n && s[i] == '}') return 0;
        return -1;
    }
}
