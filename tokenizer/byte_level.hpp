// GPT-2's byte-to-character map: vocab.json and merges.txt hold token bytes as text, each byte
// written as one Unicode character. The printable bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) stand for themselves; the other 68 bytes, in increasing order, become
// U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). The first 256 ids of
// GPT-2's vocabulary follow the printable bytes first, then the others.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fusion::tok {

/// The code point that byte `b` is written as.
uint32_t byte_to_char(uint8_t b) noexcept;
/// The bytes in GPT-2's id order of its first 256 tokens.
const std::array<uint8_t, 256>& gpt2_byte_order() noexcept;
/// `bytes` written with the map, as UTF-8.
std::string bytes_to_text(std::string_view bytes);
/// The bytes that `text` (UTF-8 of mapped characters) stands for; nullopt when it holds
/// invalid UTF-8 or a character outside the map, `bad_at` then is its byte offset.
std::optional<std::string> text_to_bytes(std::string_view text, size_t* bad_at = nullptr);

}  // namespace fusion::tok
