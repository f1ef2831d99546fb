#pragma once

#include <string>
#include <string_view>

// GPT-2's reversible byte <-> printable-character map used by byte-level BPE: printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. (space -> 'Ġ').
namespace tandem::byte_level {

// UTF-8 of the character that stands for `byte`.
std::string_view ByteToChars(unsigned char byte);

// The byte that `cp` stands for, or -1 when `cp` is not in the map's image.
int CharToByte(char32_t cp);

// Every byte of `text` replaced by its character.
std::string Encode(std::string_view text);

}  // namespace tandem::byte_level
