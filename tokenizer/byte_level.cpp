#include "tokenizer/byte_level.hpp"

namespace fusion::tok {

namespace {

bool printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct tables {
  std::array<uint32_t, 256> to_char{};
  std::array<uint8_t, 256> order{};
  tables() {
    int n = 0, extra = 0;
    for (int b = 0; b < 256; ++b)
      if (printable(b)) {
        to_char[b] = static_cast<uint32_t>(b);
        order[n++] = static_cast<uint8_t>(b);
      }
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) {
        to_char[b] = 256u + static_cast<uint32_t>(extra++);
        order[n++] = static_cast<uint8_t>(b);
      }
  }
};

const tables& the_tables() {
  static const tables t;
  return t;
}

// The byte a mapped code point stands for, -1 for none.
int char_to_byte(uint32_t cp) {
  if (cp < 256) return printable(static_cast<int>(cp)) ? static_cast<int>(cp) : -1;
  if (cp >= 256 + 68) return -1;
  int k = static_cast<int>(cp - 256);
  for (int b = 0; b < 256; ++b)
    if (!printable(b) && k-- == 0) return b;
  return -1;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) noexcept { return the_tables().to_char[b]; }
const std::array<uint8_t, 256>& gpt2_byte_order() noexcept { return the_tables().order; }

std::string bytes_to_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    uint32_t cp = byte_to_char(static_cast<uint8_t>(c));
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {  // every mapped code point is below U+0800: two UTF-8 bytes
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::optional<std::string> text_to_bytes(std::string_view text, size_t* bad_at) {
  static const auto reverse = [] {
    std::array<int16_t, 512> r{};
    r.fill(-1);
    for (uint32_t cp = 0; cp < 512; ++cp) r[cp] = static_cast<int16_t>(char_to_byte(cp));
    return r;
  }();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto c0 = static_cast<uint8_t>(text[i]);
    uint32_t cp = 0;
    size_t len = 0;
    if (c0 < 0x80) {
      cp = c0, len = 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu), len = 2;
      if (cp < 0x80) len = 0;  // an overlong form is not UTF-8
    }
    int b = len && cp < reverse.size() ? reverse[cp] : -1;
    if (b < 0) {
      if (bad_at) *bad_at = i;
      return std::nullopt;
    }
    out += static_cast<char>(b);
    i += len;
  }
  return out;
}

}  // namespace fusion::tok
