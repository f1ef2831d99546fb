#include "common/tokenizer/unicode.h"

#include "gtest/gtest.h"

namespace tandem::unicode {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(UnicodeTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xF8\x88\x80\x80\x80"));
}

TEST(UnicodeTest, LossyDecodingMatchesRust) {
  // One U+FFFD per maximal ill-formed subsequence (Rust String::from_utf8_lossy).
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"
                      "a"),
            std::string(kFffd) + "a");
  EXPECT_EQ(Utf8Lossy("\xE0\x80"), std::string(kFffd) + kFffd);
  EXPECT_EQ(Utf8Lossy("\xC3\xC3\xA9"), std::string(kFffd) + "\xC3\xA9");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy("\xFF"
                      "b"),
            std::string(kFffd) + "b");
}

TEST(UnicodeTest, Normalization) {
  EXPECT_EQ(Nfc("e\xCC\x81"), "\xC3\xA9");  // e + acute -> é
  EXPECT_EQ(Nfd("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Nfc("e\xCC\xA3\xCC\x82"), "\xE1\xBB\x87");  // ệ, marks in canonical order
  EXPECT_EQ(Nfc("e\xCC\x82\xCC\xA3"), "\xE1\xBB\x87");  // ... and in reverse order
  EXPECT_EQ(Nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(Nfd("\xEA\xB0\x81"), "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
  EXPECT_EQ(Nfc("\xE2\x84\xAB"), "\xC3\x85");      // Angstrom sign (singleton)
  EXPECT_EQ(Nfc("\xEF\xAC\x81"), "\xEF\xAC\x81");  // ligature fi kept by NFC
  EXPECT_EQ(Nfkc("\xEF\xAC\x81"), "fi");
  EXPECT_EQ(Nfkd("\xE2\x91\xA0"), "1");  // circled one
  EXPECT_EQ(Nfc("plain ascii"), "plain ascii");
}

TEST(UnicodeTest, Lowercase) {
  EXPECT_EQ(ToLower("HeLLo"), "hello");
  EXPECT_EQ(ToLower("\xC3\x89T\xC3\x89"), "\xC3\xA9t\xC3\xA9");                // ÉTÉ
  EXPECT_EQ(ToLower("\xCE\xA3\xCE\x91\xCE\xA3"), "\xCF\x83\xCE\xB1\xCF\x82");  // ΣΑΣ -> σας
  EXPECT_EQ(ToLower("\xC4\xB0"), "i\xCC\x87");                                 // İ
}

TEST(UnicodeTest, Whitespace) {
  for (char32_t cp : {U' ', U'\t', U'\n', U'\x0B', U'\x0C', U'\r', U'\x85', U'\xA0', U'\x2003',
                      U'\x3000', U'\x2028'}) {
    EXPECT_TRUE(IsWhitespace(cp)) << static_cast<int>(cp);
  }
  for (char32_t cp : {U'a', U'\x200B', U'\xFEFF', U'\x180E'}) {
    EXPECT_FALSE(IsWhitespace(cp)) << static_cast<int>(cp);
  }
}

}  // namespace
}  // namespace tandem::unicode
