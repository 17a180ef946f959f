// The user-assigned managed identity the Function app runs as. It is created first and on its
// own, so every role can be granted to it before the app starts.

@description('Name of the identity.')
param name string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output clientId string = identity.properties.clientId
output principalId string = identity.properties.principalId
