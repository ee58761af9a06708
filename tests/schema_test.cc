#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mmtensor/error.h"
#include "mmtensor/schema.h"

namespace mmt {
namespace {

TEST(SchemaTest, FieldKinds) {
  Field image = Field::fixed("image", kUInt8, {3, 32, 32});
  EXPECT_TRUE(image.is_fixed());
  EXPECT_EQ(image.fixed_numel(), 3 * 32 * 32);
  EXPECT_EQ(Field::fixed("x", kFloat32, {4}).fixed_nbytes(), 16);
  EXPECT_EQ(Field::fixed("scalar", kInt64, {}).fixed_numel(), 1);
  Field tokens = Field::ragged("tokens", kInt32, {kVariableDim});
  EXPECT_FALSE(tokens.is_fixed());
  EXPECT_EQ(tokens.variable_dims(), 1);
  EXPECT_THROW(tokens.fixed_numel(), ValueError);
  Field jpeg = Field::bytes("jpeg");
  EXPECT_EQ(jpeg.dtype, kUInt8);
  EXPECT_EQ(jpeg.shape, DimVector({kVariableDim}));
  EXPECT_THROW(Field::fixed("x", kUInt8, {kVariableDim}), ValueError);
  EXPECT_THROW(Field::ragged("x", kUInt8, {3}), ValueError);
}

TEST(SchemaTest, InvalidFieldsAreRefusedWithTheirName) {
  EXPECT_THROW(Field::fixed("", kUInt8, {1}), ValueError);
  try {
    Field::fixed("bad", kUInt8, {2, 0});
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'bad'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Field::fixed("neg", kUInt8, {-2}), ValueError);
  EXPECT_THROW(Field::fixed("huge", kFloat64, {int64_t{1} << 40, int64_t{1} << 30}), ValueError);
  EXPECT_THROW(Field::fixed("x", kUInt8, {2, 3}).with_storage_order({0, 0}), ValueError);
  EXPECT_THROW(Field::fixed("x", kUInt8, {2, 3}).with_storage_order({0}), ValueError);
  EXPECT_THROW(Field::fixed("x", kUInt8, {2, 3}).with_storage_order({0, 2}), ValueError);
  EXPECT_THROW(Field::fixed("x", kUInt8, {2, 3}).stored_channels_last(), ValueError);
}

TEST(SchemaTest, FieldNamesAreUsableAsFileNamesAndJsonText) {
  // `mmt export` writes NAME.npy into a folder, and the schema block is JSON (UTF-8): a name
  // that is a path, a control sequence for the terminal, or not UTF-8 is refused.
  for (const std::string& bad : std::vector<std::string>{"a/b", "/etc/passwd", "..", ".", std::string("x\0y", 3), "\x1b]0;pwned\a",
                                 "tab\there", "\x7f", "csi\xc2\x9b", "\xff\xfe", "\xc0\xaf", "\xed\xa0\x80"}) {
    try {
      Field::fixed(bad, kUInt8, {1});
      ADD_FAILURE() << "accepted a field name of " << bad.size() << " bytes";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("field name"), std::string::npos) << e.what();
    }
  }
  for (const std::string& good : std::vector<std::string>{"image", "a.b", "..x", "label_0", "caf\xc3\xa9", "\xe5\x9b\xbe\xe5\x83\x8f",
                                  "\xf0\x9f\x93\xb7"})
    EXPECT_NO_THROW(Field::fixed(good, kUInt8, {1})) << good;
}

TEST(SchemaTest, ValueStridesFollowTheStorageOrder) {
  const int64_t C = 3, H = 224, W = 200;
  Field image = Field::fixed("image", kUInt8, {C, H, W});
  EXPECT_EQ(image.value_strides(image.shape), DimVector({H * W, W, 1}));
  image.stored_channels_last();
  EXPECT_EQ(image.storage_order, DimVector({1, 2, 0}));
  EXPECT_EQ(image.value_strides(image.shape), DimVector({1, W * C, C}));
  Field video = Field::fixed("video", kUInt8, {C, 4, H, W}).stored_channels_last();
  EXPECT_EQ(video.value_strides(video.shape), DimVector({1, H * W * C, W * C, C}));
  Field ragged = Field::ragged("r", kFloat32, {kVariableDim, 2}).with_storage_order({1, 0});
  EXPECT_EQ(ragged.value_strides({5, 2}), DimVector({1, 5}));
  // The identity order is the same layout as no order.
  Field identity = Field::fixed("image", kUInt8, {C, H, W}).with_storage_order({0, 1, 2});
  EXPECT_TRUE(identity.storage_order.empty());
  EXPECT_EQ(identity, Field::fixed("image", kUInt8, {C, H, W}));
}

TEST(SchemaTest, NamesAreUniqueAndLookupsListTheKnownNames) {
  Schema schema({Field::fixed("image", kUInt8, {1}), Field::fixed("label", kInt64, {})});
  EXPECT_EQ(schema.size(), 2u);
  EXPECT_EQ(schema.index_of("label"), 1u);
  EXPECT_EQ(schema.find("nope"), std::nullopt);
  try {
    schema.index_of("lable");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "unknown field 'lable'; the schema has 'image', 'label'");
  }
  EXPECT_THROW(schema.add(Field::fixed("image", kUInt8, {2})), ValueError);
  EXPECT_TRUE(schema.all_fixed());
  schema.add(Field::bytes("raw"));
  EXPECT_FALSE(schema.all_fixed());
  EXPECT_NE(schema, Schema({Field::fixed("image", kUInt8, {1})}));
}

}  // namespace
}  // namespace mmt
